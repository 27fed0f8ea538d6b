#include "scheduler/job_yaml.h"

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "scheduler/job_validation.h"
#include "yaml-cpp/yaml.h"

namespace pscluster::scheduler {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

int LineOfNode(const YAML::Node& n) {
  YAML::Mark m = n.Mark();
  return m.line >= 0 ? m.line + 1 : 0;
}

std::string Join(const std::string& path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

// The prefix shared by every value name of an enum, up to and including an underscore
// ("DT_" for DataType), or "" when there is none.
std::string CommonPrefix(const EnumDescriptor* e) {
  if (e->value_count() < 2) return "";
  std::string prefix = e->value(0)->name();
  for (int i = 1; i < e->value_count(); ++i) {
    const std::string& n = e->value(i)->name();
    size_t k = 0;
    while (k < prefix.size() && k < n.size() && prefix[k] == n[k]) ++k;
    prefix.resize(k);
  }
  size_t us = prefix.rfind('_');
  return us == std::string::npos ? "" : prefix.substr(0, us + 1);
}

bool IsPlaceholder(const EnumValueDescriptor* v) {
  return v->number() == 0 && (v->name().find("UNSPECIFIED") != std::string::npos ||
                              v->name().find("INVALID") != std::string::npos);
}

// Short, lower-case name of an enum value as written in job files ("adam", "float16").
std::string ShortName(const EnumValueDescriptor* v) {
  std::string prefix = CommonPrefix(v->type());
  std::string n = v->name();
  if (!prefix.empty() && n.size() > prefix.size()) n = n.substr(prefix.size());
  return absl::AsciiStrToLower(n);
}

const EnumValueDescriptor* FindEnumValue(const EnumDescriptor* e, absl::string_view text) {
  std::string want = absl::AsciiStrToUpper(text);
  for (char& c : want) {
    if (c == '-') c = '_';
  }
  if (e->full_name() == "pscluster.v1.DataType") {
    if (want == "FP32" || want == "F32" || want == "FLOAT") want = "DT_FLOAT32";
    if (want == "FP16" || want == "F16" || want == "HALF") want = "DT_FLOAT16";
    if (want == "BF16") want = "DT_BFLOAT16";
  }
  std::string prefix = CommonPrefix(e);
  for (int i = 0; i < e->value_count(); ++i) {
    const EnumValueDescriptor* v = e->value(i);
    if (v->name() == want || (!prefix.empty() && v->name() == prefix + want)) return v;
  }
  return nullptr;
}

std::string EnumChoices(const EnumDescriptor* e) {
  std::vector<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    if (!IsPlaceholder(e->value(i))) names.push_back(ShortName(e->value(i)));
  }
  return absl::StrJoin(names, ", ");
}

std::string FieldNames(const Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return absl::StrJoin(names, ", ");
}

// Edit distance, to suggest the field a misspelt key meant.
size_t Distance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

class Parser {
 public:
  explicit Parser(JobSource* where) : where_(where) {}

  absl::Status ParseMessage(const YAML::Node& node, Message* msg, const std::string& path) {
    if (!node.IsMap()) {
      return where_->ErrorAtLine(LineOfNode(node), path,
                                 node.IsNull() ? "has no value (expected a mapping of key: value)"
                                               : "expected a mapping of key: value");
    }
    const Descriptor* d = msg->GetDescriptor();
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      // Copies (cheap handles): `it->` returns a temporary proxy, so references into it would
      // dangle once this statement ends.
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      int key_line = LineOfNode(key);
      if (!key.IsScalar()) {
        return where_->ErrorAtLine(key_line, path, "keys must be plain names");
      }
      std::string name = key.Scalar();
      std::string fpath = Join(path, name);
      if (!seen.insert(name).second) {
        return where_->ErrorAtLine(key_line, fpath, "duplicate key");
      }
      const FieldDescriptor* f = d->FindFieldByName(name);
      if (f == nullptr) return UnknownField(d, name, key_line, fpath);
      where_->SetLine(fpath, key_line);
      if (value.IsNull()) return where_->ErrorAtLine(key_line, fpath, "has no value");
      absl::Status s;
      if (f->is_map()) {
        s = ParseMap(value, msg, f, fpath);
      } else if (f->is_repeated()) {
        s = ParseRepeated(value, msg, f, fpath);
      } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        s = ParseMessage(value, msg->GetReflection()->MutableMessage(msg, f), fpath);
      } else {
        s = ParseScalar(value, msg, f, fpath, /*repeated=*/false);
      }
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status UnknownField(const Descriptor* d, const std::string& name, int line,
                            const std::string& fpath) {
    std::string best;
    size_t best_d = 3;  // Suggest only close matches.
    for (int i = 0; i < d->field_count(); ++i) {
      size_t dist = Distance(name, d->field(i)->name());
      if (dist < best_d) {
        best_d = dist;
        best = d->field(i)->name();
      }
    }
    std::string msg = best.empty()
                          ? absl::StrCat("unknown field (expected one of ", FieldNames(d), ")")
                          : absl::StrCat("unknown field (did you mean '", best, "'?)");
    return where_->ErrorAtLine(line, fpath, msg);
  }

  absl::Status ParseRepeated(const YAML::Node& value, Message* msg, const FieldDescriptor* f,
                             const std::string& fpath) {
    if (!value.IsSequence()) {
      return where_->ErrorAtLine(LineOfNode(value), fpath, "expected a list ([a, b] or - items)");
    }
    for (size_t i = 0; i < value.size(); ++i) {
      std::string epath = absl::StrCat(fpath, "[", i, "]");
      where_->SetLine(epath, LineOfNode(value[i]));
      absl::Status s;
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        s = ParseMessage(value[i], msg->GetReflection()->AddMessage(msg, f), epath);
      } else {
        s = ParseScalar(value[i], msg, f, epath, /*repeated=*/true);
      }
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status ParseMap(const YAML::Node& value, Message* msg, const FieldDescriptor* f,
                        const std::string& fpath) {
    if (!value.IsMap()) {
      return where_->ErrorAtLine(LineOfNode(value), fpath, "expected a mapping of name: value");
    }
    const Descriptor* entry = f->message_type();
    const FieldDescriptor* kf = entry->map_key();
    const FieldDescriptor* vf = entry->map_value();
    if (kf->cpp_type() != FieldDescriptor::CPPTYPE_STRING) {
      return where_->ErrorAtLine(LineOfNode(value), fpath, "only string-keyed maps are supported");
    }
    std::set<std::string> seen;
    for (auto it = value.begin(); it != value.end(); ++it) {
      int line = LineOfNode(it->first);
      if (!it->first.IsScalar()) return where_->ErrorAtLine(line, fpath, "keys must be names");
      std::string k = it->first.Scalar();
      std::string epath = absl::StrCat(fpath, "[", k, "]");
      if (!seen.insert(k).second) return where_->ErrorAtLine(line, epath, "duplicate key");
      where_->SetLine(epath, line);
      Message* e = msg->GetReflection()->AddMessage(msg, f);
      e->GetReflection()->SetString(e, kf, k);
      if (it->second.IsNull()) return where_->ErrorAtLine(line, epath, "has no value");
      absl::Status s;
      if (vf->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        s = ParseMessage(it->second, e->GetReflection()->MutableMessage(e, vf), epath);
      } else {
        s = ParseScalar(it->second, e, vf, epath, /*repeated=*/false);
      }
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status ParseScalar(const YAML::Node& value, Message* msg, const FieldDescriptor* f,
                           const std::string& fpath, bool repeated) {
    int line = LineOfNode(value);
    if (!value.IsScalar()) {
      return where_->ErrorAtLine(line, fpath, absl::StrCat("expected a single ", TypeName(f)));
    }
    const std::string& text = value.Scalar();
    const Reflection* r = msg->GetReflection();
    auto bad = [&](absl::string_view what) {
      return where_->ErrorAtLine(line, fpath, absl::StrCat(what, " (got '", text, "')"));
    };
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        repeated ? r->AddString(msg, f, text) : r->SetString(msg, f, text);
        return absl::OkStatus();
      case FieldDescriptor::CPPTYPE_BOOL: {
        std::string t = absl::AsciiStrToLower(text);
        bool v;
        if (t == "true" || t == "yes" || t == "on") {
          v = true;
        } else if (t == "false" || t == "no" || t == "off") {
          v = false;
        } else {
          return bad("must be true or false");
        }
        repeated ? r->AddBool(msg, f, v) : r->SetBool(msg, f, v);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const EnumValueDescriptor* v = FindEnumValue(f->enum_type(), text);
        if (v == nullptr) {
          return bad(absl::StrCat("must be one of ", EnumChoices(f->enum_type())));
        }
        repeated ? r->AddEnum(msg, f, v) : r->SetEnum(msg, f, v);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_FLOAT:
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        double v;
        if (!absl::SimpleAtod(text, &v)) return bad("must be a number");
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
          if (std::isfinite(v) && std::fabs(v) > std::numeric_limits<float>::max()) {
            return bad("is out of range for a float");
          }
          repeated ? r->AddFloat(msg, f, static_cast<float>(v))
                   : r->SetFloat(msg, f, static_cast<float>(v));
        } else {
          repeated ? r->AddDouble(msg, f, v) : r->SetDouble(msg, f, v);
        }
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64: {
        int64_t v;
        if (!absl::SimpleAtoi(text, &v)) return bad("must be a whole number");
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
          if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
            return bad("is out of range");
          }
          repeated ? r->AddInt32(msg, f, v) : r->SetInt32(msg, f, v);
        } else {
          repeated ? r->AddInt64(msg, f, v) : r->SetInt64(msg, f, v);
        }
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_UINT32:
      case FieldDescriptor::CPPTYPE_UINT64: {
        int64_t neg;
        if (absl::SimpleAtoi(text, &neg) && neg < 0) {
          return where_->ErrorAtLine(line, fpath, absl::StrCat("must be >= 0 (got ", neg, ")"));
        }
        uint64_t v;
        if (!absl::SimpleAtoi(text, &v)) return bad("must be a whole number >= 0");
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32) {
          if (v > std::numeric_limits<uint32_t>::max()) {
            return bad("is out of range (at most 4294967295)");
          }
          repeated ? r->AddUInt32(msg, f, v) : r->SetUInt32(msg, f, v);
        } else {
          repeated ? r->AddUInt64(msg, f, v) : r->SetUInt64(msg, f, v);
        }
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        break;
    }
    return where_->ErrorAtLine(line, fpath, "unsupported field type");
  }

  static std::string TypeName(const FieldDescriptor* f) {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        return "string";
      case FieldDescriptor::CPPTYPE_BOOL:
        return "true/false value";
      case FieldDescriptor::CPPTYPE_ENUM:
        return absl::StrCat("name (one of ", EnumChoices(f->enum_type()), ")");
      case FieldDescriptor::CPPTYPE_MESSAGE:
        return "mapping";
      default:
        return "number";
    }
  }

  JobSource* where_;
};

void EmitMessage(YAML::Emitter& out, const Message& msg);

void EmitScalar(YAML::Emitter& out, const Message& msg, const FieldDescriptor* f, int index) {
  const Reflection* r = msg.GetReflection();
  bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      out << (rep ? r->GetRepeatedString(msg, f, index) : r->GetString(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      out << (rep ? r->GetRepeatedBool(msg, f, index) : r->GetBool(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      out << ShortName(rep ? r->GetRepeatedEnum(msg, f, index) : r->GetEnum(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      out << (rep ? r->GetRepeatedFloat(msg, f, index) : r->GetFloat(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      out << (rep ? r->GetRepeatedDouble(msg, f, index) : r->GetDouble(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_INT32:
      out << (rep ? r->GetRepeatedInt32(msg, f, index) : r->GetInt32(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      out << (rep ? r->GetRepeatedInt64(msg, f, index) : r->GetInt64(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      out << (rep ? r->GetRepeatedUInt32(msg, f, index) : r->GetUInt32(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      out << (rep ? r->GetRepeatedUInt64(msg, f, index) : r->GetUInt64(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      EmitMessage(out, rep ? r->GetRepeatedMessage(msg, f, index) : r->GetMessage(msg, f));
      break;
  }
}

void EmitMessage(YAML::Emitter& out, const Message& msg) {
  const Reflection* r = msg.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(msg, &fields);
  out << YAML::BeginMap;
  for (const FieldDescriptor* f : fields) {
    out << YAML::Key << f->name() << YAML::Value;
    if (f->is_map()) {
      out << YAML::BeginMap;
      for (int i = 0; i < r->FieldSize(msg, f); ++i) {
        const Message& e = r->GetRepeatedMessage(msg, f, i);
        const FieldDescriptor* kf = e.GetDescriptor()->map_key();
        const FieldDescriptor* vf = e.GetDescriptor()->map_value();
        out << YAML::Key << e.GetReflection()->GetString(e, kf) << YAML::Value;
        EmitScalar(out, e, vf, -1);
      }
      out << YAML::EndMap;
    } else if (f->is_repeated()) {
      bool flow = f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE;
      if (flow) out << YAML::Flow;
      out << YAML::BeginSeq;
      for (int i = 0; i < r->FieldSize(msg, f); ++i) EmitScalar(out, msg, f, i);
      out << YAML::EndSeq;
    } else {
      EmitScalar(out, msg, f, -1);
    }
  }
  out << YAML::EndMap;
}

}  // namespace

absl::Status ParseYamlInto(absl::string_view text, Message* msg, JobSource* where) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    int line = e.mark.line >= 0 ? e.mark.line + 1 : 0;
    return where->ErrorAtLine(line, "", absl::StrCat("not valid YAML: ", e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) return where->ErrorAtLine(0, "", "the file is empty");
  try {
    return Parser(where).ParseMessage(root, msg, "");
  } catch (const YAML::Exception& e) {
    int line = e.mark.line >= 0 ? e.mark.line + 1 : 0;
    return where->ErrorAtLine(line, "", absl::StrCat("cannot read YAML: ", e.msg));
  }
}

absl::Status ParseJobYaml(absl::string_view text, v1::JobSpec* spec, JobSource* where) {
  return ParseYamlInto(text, spec, where);
}

absl::StatusOr<v1::JobSpec> LoadJobYaml(absl::string_view text, const std::string& source) {
  JobSource where(source);
  v1::JobSpec spec;
  absl::Status s = ParseJobYaml(text, &spec, &where);
  if (!s.ok()) return s;
  s = ValidateJobSpec(spec, where);
  if (!s.ok()) return s;
  ApplyJobDefaults(&spec);
  return spec;
}

std::string JobSpecToYaml(const v1::JobSpec& spec) {
  YAML::Emitter out;
  EmitMessage(out, spec);
  return std::string(out.c_str()) + "\n";
}

}  // namespace pscluster::scheduler
