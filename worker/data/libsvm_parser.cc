#include "worker/data/libsvm_parser.h"

#include "absl/strings/str_cat.h"
#include "worker/data/text_scan.h"

namespace pscluster::data {
namespace {

inline bool IsSpace(char c) { return c == ' ' || c == '\t'; }

inline const char* SkipSpaces(const char* p, const char* end) {
  while (p < end && IsSpace(*p)) ++p;
  return p;
}

// The end of a field: a space, the end of the line or a comment.
inline bool AtFieldEnd(const char* p, const char* end) {
  return p == end || IsSpace(*p) || *p == '#';
}

}  // namespace

LibSvmParser::LibSvmParser(const DatasetOptions& options)
    : labels_(options.num_classes, options.label_base),
      index_base_(options.index_base),
      num_features_(options.num_features) {
  schema_.num_classes = options.num_classes;
  schema_.key_space = options.num_features;
}

bool LibSvmParser::HasData(absl::string_view line) const {
  const char* p = SkipSpaces(line.data(), line.data() + line.size());
  return p != line.data() + line.size() && *p != '#';
}

ParseOutcome LibSvmParser::Parse(absl::string_view line, Example* out, ParseError* error) const {
  const char* const begin = line.data();
  const char* const end = begin + line.size();
  auto fail = [&](const char* at, auto&&... what) {
    error->column = static_cast<size_t>(at - begin) + 1;
    error->expected = absl::StrCat("expected ", what..., ", found '", TokenAt(at, end), "'");
    return ParseOutcome::kError;
  };
  const char* p = SkipSpaces(begin, end);
  if (p == end || *p == '#') return ParseOutcome::kNoData;
  out->Clear();
  float label = 0;
  const char* at = p;
  if (!ScanFloat(&p, end, &label) || !AtFieldEnd(p, end)) {
    return fail(at, labels_.Describe());
  }
  if (!labels_.Apply(label, &out->label)) return fail(at, labels_.Describe());
  while (true) {
    p = SkipSpaces(p, end);
    if (p == end || *p == '#') break;
    at = p;
    if (end - p >= 4 && p[0] == 'q' && p[1] == 'i' && p[2] == 'd' && p[3] == ':') {
      uint64_t qid = 0;
      p += 4;
      if (!ScanUint64(&p, end, &qid) || !AtFieldEnd(p, end)) {
        return fail(at + 4, "a query id (an integer) after 'qid:'");
      }
      continue;
    }
    uint64_t index = 0;
    if (!ScanUint64(&p, end, &index)) return fail(at, "a feature 'index:value'");
    if (p == end || *p != ':') return fail(p, "':' after the feature index");
    if (index < index_base_ || (num_features_ > 0 && index - index_base_ >= num_features_)) {
      if (num_features_ > 0) {
        return fail(at, "a feature index in [", index_base_, ", ", num_features_ - 1 + index_base_,
                    "]");
      }
      return fail(at, "a feature index >= ", index_base_);
    }
    ++p;
    float value = 0;
    const char* vat = p;
    if (!ScanFloat(&p, end, &value)) return fail(vat, "a feature value (a number)");
    if (!AtFieldEnd(p, end)) return fail(p, "a space or the end of the line after the value");
    out->keys.push_back(index - index_base_);
    out->values.push_back(value);
  }
  return ParseOutcome::kExample;
}

}  // namespace pscluster::data
