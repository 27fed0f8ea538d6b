#include "common/validate_enums.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"

namespace pscluster {
namespace {

using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Requests nest a few levels; a hostile one cannot nest deeper than protobuf's own parse limit
// (100), which bounds this recursion.
absl::Status Check(const Message& m, const std::string& prefix) {
  const Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string name = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
      const EnumDescriptor* e = f->enum_type();
      auto bad = [&](int value, const std::string& where) {
        std::vector<std::string> names;
        for (int i = 0; i < e->value_count(); ++i) names.push_back(e->value(i)->name());
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", value, " is not a value of ",
                                                       e->full_name(), " (",
                                                       absl::StrJoin(names, ", "), ")"));
      };
      if (f->is_repeated()) {
        for (int i = 0, n = r->FieldSize(m, f); i < n; ++i) {
          const int v = r->GetRepeatedEnumValue(m, f, i);
          if (e->FindValueByNumber(v) == nullptr) return bad(v, absl::StrCat(name, "[", i, "]"));
        }
      } else {
        const int v = r->GetEnumValue(m, f);
        if (e->FindValueByNumber(v) == nullptr) return bad(v, name);
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int i = 0, n = r->FieldSize(m, f); i < n; ++i) {
          absl::Status s = Check(r->GetRepeatedMessage(m, f, i), absl::StrCat(name, "[", i, "]"));
          if (!s.ok()) return s;
        }
      } else {
        absl::Status s = Check(r->GetMessage(m, f), name);
        if (!s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateEnums(const Message& message) { return Check(message, ""); }

}  // namespace pscluster
