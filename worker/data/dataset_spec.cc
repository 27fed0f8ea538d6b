#include "worker/data/dataset_spec.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace pscluster::data {
namespace {

absl::Status Prefixed(const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("dataset.", s.message()));
}

// The message of a Parse* error without its key ("'x' is not one of ...").
std::string Why(const absl::Status& s) {
  absl::string_view m = s.message();
  const size_t colon = m.find(": ");
  return std::string(colon == absl::string_view::npos ? m : m.substr(colon + 2));
}

}  // namespace

absl::StatusOr<DatasetOptions> DatasetOptionsOf(const v1::DatasetSpec& spec, uint64_t job_seed) {
  auto bad = [](const std::string& key, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("dataset.", key, ": ", why));
  };
  if (!spec.name().empty()) {
    return bad("name", "give either a built-in data set (name) or your files (format), not both");
  }
  if (!spec.path().empty()) return bad("path", "your files are named by train (and test)");
  if (spec.hash_bits() != 0) return bad("hash_bits", "applies only to spam_assassin");
  if (spec.num_examples() != 0 || spec.zipf_exponent() != 0) {
    return bad(spec.num_examples() != 0 ? "num_examples" : "zipf_exponent",
               "is not supported yet (it was for synthetic_zipf)");
  }
  DatasetOptions o;
  auto format = ParseDataFormat(spec.format());
  if (!format.ok()) return Prefixed(format.status());
  o.format = *format;
  o.train = spec.train();
  o.test = spec.test();
  o.holdout_fraction = spec.holdout_fraction();
  o.seed = spec.seed() != 0 ? spec.seed() : job_seed;
  if (spec.has_shuffle_window()) o.shuffle_window = spec.shuffle_window();
  if (!spec.on_error().empty()) {
    auto e = ParseOnError(spec.on_error());
    if (!e.ok()) return Prefixed(e.status());
    o.on_error = *e;
  }
  if (spec.has_max_error_fraction()) o.max_error_fraction = spec.max_error_fraction();
  if (spec.num_classes() != 0) o.num_classes = spec.num_classes();
  o.label_base = spec.label_base();
  if (spec.has_index_base()) o.index_base = spec.index_base();
  o.num_features = spec.num_features();
  if (!spec.label_column().empty()) o.label_column = spec.label_column();
  for (int i = 0; i < spec.columns_size(); ++i) {
    const v1::DatasetColumn& c = spec.columns(i);
    ColumnOptions col;
    col.name = c.name();
    if (!c.kind().empty()) {
      auto k = ParseColumnKind(c.kind());
      if (!k.ok()) {
        return bad(absl::StrCat("columns[", i, "].kind"), Why(k.status()));
      }
      col.kind = *k;
    }
    if (c.has_default_value()) col.default_value = c.default_value();
    col.buckets = c.buckets();
    o.columns.push_back(std::move(col));
  }
  if (!spec.other_columns().empty()) {
    auto k = ParseColumnKind(spec.other_columns());
    if (!k.ok()) return bad("other_columns", Why(k.status()));
    o.other_columns = *k;
  }
  if (spec.na_values_size() > 0) o.na_values.assign(spec.na_values().begin(), spec.na_values().end());
  if (spec.hash_buckets() != 0) o.hash_buckets = spec.hash_buckets();
  o.missing_value = spec.missing_value();
  if (!spec.dense_transform().empty()) {
    auto t = ParseDenseTransform(spec.dense_transform());
    if (!t.ok()) return Prefixed(t.status());
    o.dense_transform = *t;
  }
  if (!spec.split().empty()) {
    auto m = ParseSplitMode(spec.split());
    if (!m.ok()) return Prefixed(m.status());
    o.split = *m;
  }
  if (spec.chunk_bytes() != 0) o.chunk_bytes = spec.chunk_bytes();
  if (spec.max_line_bytes() != 0) o.max_line_bytes = spec.max_line_bytes();
  if (spec.prefetch_batches() != 0) o.prefetch_batches = spec.prefetch_batches();
  if (spec.batch_examples() != 0) o.batch_examples = spec.batch_examples();
  absl::Status v = Validate(o);
  if (!v.ok()) return Prefixed(v);
  return o;
}

uint64_t KeySpaceOf(const DatasetOptions& o) {
  switch (o.format) {
    case DataFormat::kLibSvm:
      return o.num_features;
    case DataFormat::kCriteo:
      return 26 * o.hash_buckets;
    case DataFormat::kCsv:
    case DataFormat::kTsv: {
      uint64_t n = 0;
      for (const ColumnOptions& c : o.columns) {
        if (c.kind == ColumnKind::kCategorical) n += c.buckets != 0 ? c.buckets : o.hash_buckets;
      }
      // Undeclared columns read as categorical: as many fields as the header has, unknown here.
      return o.other_columns == ColumnKind::kCategorical ? 0 : n;
    }
  }
  return 0;
}

}  // namespace pscluster::data
