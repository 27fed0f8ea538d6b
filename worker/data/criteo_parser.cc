#include "worker/data/criteo_parser.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/data/feature_map.h"
#include "worker/data/text_scan.h"

namespace pscluster::data {
namespace {

constexpr int kCells = 1 + kCriteoDense + kCriteoCategorical;

}  // namespace

CriteoParser::CriteoParser(const DatasetOptions& options)
    : labels_(options.num_classes, options.label_base),
      missing_value_(options.missing_value),
      log1p_(options.dense_transform == DenseTransform::kLog1p) {
  schema_.num_classes = options.num_classes;
  for (int i = 1; i <= kCriteoDense; ++i) schema_.dense.push_back(absl::StrCat("I", i));
  for (int i = 1; i <= kCriteoCategorical; ++i) {
    schema_.fields.push_back({absl::StrCat("C", i), schema_.key_space, options.hash_buckets});
    schema_.key_space += options.hash_buckets;
  }
}

bool CriteoParser::HasData(absl::string_view line) const {
  for (char c : line) {
    if (c != ' ') return true;
  }
  return false;
}

ParseOutcome CriteoParser::Parse(absl::string_view line, Example* out, ParseError* error) const {
  if (!HasData(line)) return ParseOutcome::kNoData;
  const char* const begin = line.data();
  const char* const end = begin + line.size();
  auto fail = [&](const char* at, auto&&... what) {
    error->column = static_cast<size_t>(at - begin) + 1;
    error->expected = absl::StrCat("expected ", what...);
    return ParseOutcome::kError;
  };
  out->Clear();
  out->dense.resize(kCriteoDense);
  out->keys.resize(kCriteoCategorical);
  out->values.assign(kCriteoCategorical, 1.0f);
  const char* p = begin;
  bool more = true;  // Whether a cell starts at p.
  for (int c = 0; c < kCells; ++c) {
    if (!more) {
      return fail(end, kCells, " tab-separated cells (label, I1-I13, C1-C26), found ", c);
    }
    const char* q = static_cast<const char*>(std::memchr(p, '\t', static_cast<size_t>(end - p)));
    if (q == nullptr) q = end;
    if (c == 0) {
      float v = 0;
      const char* s = p;
      if (!ScanFloat(&s, q, &v) || s != q || !labels_.Apply(v, &out->label)) {
        return fail(p, labels_.Describe(), ", found '", TokenAt(p, q), "'");
      }
    } else if (c <= kCriteoDense) {
      float v = missing_value_;
      if (q != p) {
        int64_t n = 0;
        const char* s = p;
        if (!ScanInt64(&s, q, &n) || s != q) {
          return fail(p, "an integer (I", c, ") or nothing, found '", TokenAt(p, q), "'");
        }
        v = static_cast<float>(n);
        if (log1p_) v = Log1pSigned(v);
      }
      out->dense[c - 1] = v;
    } else {
      const int f = c - 1 - kCriteoDense;
      out->keys[f] = CategoricalKey(schema_.fields[f], absl::string_view(p, q - p), q == p);
    }
    if (q == end) {
      more = false;
    } else {
      p = q + 1;
    }
  }
  if (more) {
    return fail(p - 1, kCells, " tab-separated cells (label, I1-I13, C1-C26), found more");
  }
  return ParseOutcome::kExample;
}

}  // namespace pscluster::data
