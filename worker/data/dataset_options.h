// The options of a user's data set: one field per key of a job file's `dataset:` section (the
// YAML key is the field's name; enums are spelled as the Parse* functions below accept them), so
// that the job file, the proto and this struct map 1:1.
//
//   dataset:
//     format: libsvm            # libsvm | csv | tsv | criteo
//     train: /data/ctr/train/   # a file, a directory or a glob
//     test: /data/ctr/test.gz   # or: holdout_fraction: 0.2 (a fixed share of train's lines)
//     on_error: skip            # fail | skip
//     max_error_fraction: 0.001
//
// Validate() checks the values that do not depend on the files.
#ifndef PSCLUSTER_WORKER_DATA_DATASET_OPTIONS_H_
#define PSCLUSTER_WORKER_DATA_DATASET_OPTIONS_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pscluster::data {

enum class DataFormat {
  kLibSvm,  // "libsvm" (or "svmlight"): label idx:val ... [# comment]; qid:N ignored.
  kCsv,     // "csv": comma-separated with a header line.
  kTsv,     // "tsv": tab-separated with a header line.
  kCriteo,  // "criteo": label, 13 integers, 26 categorical strings; tab-separated, no header.
};

enum class OnError {
  kFail,  // "fail": the first malformed line fails the read.
  kSkip,  // "skip": malformed lines are counted and skipped, up to max_error_fraction.
};

// How a rank's part of the set is cut from the files.
enum class SplitMode {
  kAuto,   // "auto": whole files when there are at least as many files as parts, else bytes.
  kFiles,  // "files": whole files; part a of n reads files [F*a/n, F*(a+1)/n) (or by shares).
  kBytes,  // "bytes": byte ranges of the concatenated files, cut at line boundaries; a gzip
           // file cannot be cut and belongs whole to the part holding its first byte.
};

enum class ColumnKind {
  kDense,        // "dense": a number (a missing cell reads as the column's default).
  kCategorical,  // "categorical": any string, hashed into the column's own key range.
  kIgnore,       // "ignore".
};

enum class DenseTransform {
  kNone,   // "none"
  kLog1p,  // "log1p": sign(x) * log(1 + |x|), for counts such as Criteo's integer features.
};

// A CSV/TSV column, named as in the header.
struct ColumnOptions {
  std::string name;
  ColumnKind kind = ColumnKind::kDense;
  // Dense: the value of a missing cell (empty or one of na_values); NaN = DatasetOptions'
  // missing_value.
  float default_value = std::numeric_limits<float>::quiet_NaN();
  // Categorical: keys in the column's range (one reserved for a missing cell); 0 = hash_buckets.
  uint64_t buckets = 0;
};

struct DatasetOptions {
  DataFormat format = DataFormat::kLibSvm;
  std::string train;  // A file, a directory (its files, not hidden or '_'-named) or a glob.
  std::string test;   // The same; empty = held out from `train` by holdout_fraction.
  // With `test` empty: the share of train's lines held out for testing, in (0, 1), chosen per
  // line by a hash of its bytes and `seed` (a line is on the same side in every run and every
  // rank; train and test never share a line). 0 = no test set.
  double holdout_fraction = 0;
  uint64_t seed = 0;  // Shuffling and the held-out split. The trainer passes the job's seed.
  // Examples held in the shuffle window (reading order is also shuffled by chunk); 0 or 1 =
  // read in file order.
  uint32_t shuffle_window = 10000;
  OnError on_error = OnError::kFail;
  // With on_error: skip, the read fails once more than this share of its lines were skipped
  // (checked every 1,000 lines and at the end of each pass).
  double max_error_fraction = 0.001;

  // Labels: integers in [label_base, label_base + num_classes) become classes 0..num_classes-1;
  // with 2 classes and label_base 0, -1 reads as class 0 too (SVMlight's +1/-1).
  uint32_t num_classes = 2;
  int64_t label_base = 0;

  // libsvm: feature indices start at index_base (0 or 1); key = index - index_base. With
  // num_features > 0, keys must be below it.
  uint32_t index_base = 1;
  uint64_t num_features = 0;

  // csv/tsv: the label column's name; declared columns (any others are `other_columns`).
  std::string label_column = "label";
  std::vector<ColumnOptions> columns;
  ColumnKind other_columns = ColumnKind::kDense;
  std::vector<std::string> na_values = {"NA", "NaN", "?"};  // Besides an empty cell.

  // csv/tsv/criteo: keys per categorical field (one of them for a missing value); the value of
  // a missing dense cell; a transform of dense values.
  uint64_t hash_buckets = uint64_t{1} << 20;
  float missing_value = 0;
  DenseTransform dense_transform = DenseTransform::kNone;

  // Reading.
  SplitMode split = SplitMode::kAuto;
  uint64_t chunk_bytes = uint64_t{64} << 20;  // Byte ranges are read in chunks of at most this.
  uint32_t max_line_bytes = 1u << 20;         // A longer line is malformed.
  uint32_t prefetch_batches = 8;              // Blocks of examples parsed ahead of the trainer.
  uint32_t batch_examples = 1024;             // Examples per prefetched block.
};

// INVALID_ARGUMENT naming the key ("holdout_fraction: 1.5 is not in (0, 1)").
absl::Status Validate(const DatasetOptions& options);

// The spellings above ("libsvm", "fail", "bytes", ...); INVALID_ARGUMENT lists the accepted ones.
absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name);
absl::StatusOr<OnError> ParseOnError(absl::string_view name);
absl::StatusOr<SplitMode> ParseSplitMode(absl::string_view name);
absl::StatusOr<ColumnKind> ParseColumnKind(absl::string_view name);
absl::StatusOr<DenseTransform> ParseDenseTransform(absl::string_view name);
absl::string_view DataFormatName(DataFormat format);

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_DATASET_OPTIONS_H_
