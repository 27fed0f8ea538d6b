#include "worker/data/dataset_options.h"

#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pscluster::data {
namespace {

template <typename E>
absl::StatusOr<E> ParseName(absl::string_view key, absl::string_view name,
                            std::initializer_list<std::pair<absl::string_view, E>> names) {
  std::vector<std::string> accepted;
  for (const auto& [n, e] : names) {
    if (n == name) return e;
    accepted.emplace_back(n);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(key, ": '", name, "' is not one of ", absl::StrJoin(accepted, ", ")));
}

}  // namespace

absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name) {
  return ParseName<DataFormat>("format", name,
                               {{"libsvm", DataFormat::kLibSvm},
                                {"svmlight", DataFormat::kLibSvm},
                                {"csv", DataFormat::kCsv},
                                {"tsv", DataFormat::kTsv},
                                {"criteo", DataFormat::kCriteo}});
}

absl::StatusOr<OnError> ParseOnError(absl::string_view name) {
  return ParseName<OnError>("on_error", name, {{"fail", OnError::kFail}, {"skip", OnError::kSkip}});
}

absl::StatusOr<SplitMode> ParseSplitMode(absl::string_view name) {
  return ParseName<SplitMode>(
      "split", name,
      {{"auto", SplitMode::kAuto}, {"files", SplitMode::kFiles}, {"bytes", SplitMode::kBytes}});
}

absl::StatusOr<ColumnKind> ParseColumnKind(absl::string_view name) {
  return ParseName<ColumnKind>("columns.kind", name,
                               {{"dense", ColumnKind::kDense},
                                {"categorical", ColumnKind::kCategorical},
                                {"ignore", ColumnKind::kIgnore}});
}

absl::StatusOr<DenseTransform> ParseDenseTransform(absl::string_view name) {
  return ParseName<DenseTransform>(
      "dense_transform", name,
      {{"none", DenseTransform::kNone}, {"log1p", DenseTransform::kLog1p}});
}

absl::string_view DataFormatName(DataFormat format) {
  switch (format) {
    case DataFormat::kLibSvm:
      return "libsvm";
    case DataFormat::kCsv:
      return "csv";
    case DataFormat::kTsv:
      return "tsv";
    case DataFormat::kCriteo:
      return "criteo";
  }
  return "unknown";
}

absl::Status Validate(const DatasetOptions& o) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (o.train.empty()) return bad("train: a file, a directory or a glob is needed");
  if (!(o.holdout_fraction >= 0 && o.holdout_fraction < 1)) {
    return bad("holdout_fraction: ", o.holdout_fraction, " is not in [0, 1)");
  }
  if (!o.test.empty() && o.holdout_fraction > 0) {
    return bad("holdout_fraction: with a test set (test: ", o.test, ") nothing is held out");
  }
  if (!(o.max_error_fraction >= 0 && o.max_error_fraction <= 1)) {
    return bad("max_error_fraction: ", o.max_error_fraction, " is not in [0, 1]");
  }
  if (o.num_classes < 2) return bad("num_classes: ", o.num_classes, " is below 2");
  if (o.num_classes > (1u << 24)) return bad("num_classes: ", o.num_classes, " is above 2^24");
  if (o.label_base < -(int64_t{1} << 24) || o.label_base > (int64_t{1} << 24)) {
    return bad("label_base: ", o.label_base, " is not in [-2^24, 2^24]");
  }
  if (o.index_base > 1) return bad("index_base: ", o.index_base, " is not 0 or 1");
  if (o.hash_buckets < 2) return bad("hash_buckets: ", o.hash_buckets, " is below 2");
  if (o.hash_buckets > (uint64_t{1} << 40)) {
    return bad("hash_buckets: ", o.hash_buckets, " is above 2^40");
  }
  if (!std::isfinite(o.missing_value)) return bad("missing_value: must be a finite number");
  if (o.chunk_bytes < 4096) return bad("chunk_bytes: ", o.chunk_bytes, " is below 4096");
  if (o.max_line_bytes < 64 || o.max_line_bytes > (1u << 30)) {
    return bad("max_line_bytes: ", o.max_line_bytes, " is not in [64, 2^30]");
  }
  if (o.prefetch_batches == 0) return bad("prefetch_batches: must be >= 1");
  if (o.batch_examples == 0) return bad("batch_examples: must be >= 1");
  const bool csv = o.format == DataFormat::kCsv || o.format == DataFormat::kTsv;
  if (!csv && !o.columns.empty()) {
    return bad("columns: only csv and tsv have named columns (format is ", DataFormatName(o.format),
               ")");
  }
  if (csv && o.label_column.empty()) return bad("label_column: a column name is needed");
  std::set<std::string> names;
  for (size_t i = 0; i < o.columns.size(); ++i) {
    const ColumnOptions& c = o.columns[i];
    if (c.name.empty()) return bad("columns[", i, "].name: a column name is needed");
    if (c.name == o.label_column) {
      return bad("columns[", i, "].name: '", c.name, "' is the label column");
    }
    if (!names.insert(c.name).second) {
      return bad("columns[", i, "].name: '", c.name, "' is declared twice");
    }
    if (c.kind == ColumnKind::kCategorical && c.buckets == 1) {
      return bad("columns[", i, "].buckets: 1 is below 2");
    }
    if (c.buckets > (uint64_t{1} << 40)) {
      return bad("columns[", i, "].buckets: ", c.buckets, " is above 2^40");
    }
    if (c.kind != ColumnKind::kCategorical && c.buckets != 0) {
      return bad("columns[", i, "].buckets: only a categorical column has buckets");
    }
    if (std::isinf(c.default_value)) {
      return bad("columns[", i, "].default_value: must be a finite number");
    }
  }
  return absl::OkStatus();
}

}  // namespace pscluster::data
