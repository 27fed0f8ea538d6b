#include "worker/data/dataset_options.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace pscluster::data {
namespace {

DatasetOptions Good() {
  DatasetOptions o;
  o.train = "/data/train";
  return o;
}

TEST(DatasetOptionsTest, DefaultsWithATrainPathAreValid) {
  EXPECT_TRUE(Validate(Good()).ok());
  DatasetOptions o = Good();
  o.format = DataFormat::kCsv;
  o.columns.push_back({"city", ColumnKind::kCategorical});
  EXPECT_TRUE(Validate(o).ok());
}

TEST(DatasetOptionsTest, EachBadValueNamesItsKey) {
  std::vector<std::pair<void (*)(DatasetOptions*), std::string>> cases = {
      {[](DatasetOptions* o) { o->train.clear(); },
       "train: a file, a directory or a glob is needed"},
      {[](DatasetOptions* o) { o->holdout_fraction = 1; }, "holdout_fraction: 1 is not in [0, 1)"},
      {[](DatasetOptions* o) { o->holdout_fraction = -0.5; },
       "holdout_fraction: -0.5 is not in [0, 1)"},
      {[](DatasetOptions* o) { o->max_error_fraction = 2; },
       "max_error_fraction: 2 is not in [0, 1]"},
      {[](DatasetOptions* o) { o->num_classes = 1; }, "num_classes: 1 is below 2"},
      {[](DatasetOptions* o) { o->index_base = 2; }, "index_base: 2 is not 0 or 1"},
      {[](DatasetOptions* o) { o->hash_buckets = 1; }, "hash_buckets: 1 is below 2"},
      {[](DatasetOptions* o) { o->chunk_bytes = 10; }, "chunk_bytes: 10 is below 4096"},
      {[](DatasetOptions* o) { o->max_line_bytes = 10; },
       "max_line_bytes: 10 is not in [64, 2^30]"},
      {[](DatasetOptions* o) { o->prefetch_batches = 0; }, "prefetch_batches: must be >= 1"},
      {[](DatasetOptions* o) { o->columns.push_back({"a"}); },
       "columns: only csv and tsv have named columns (format is libsvm)"},
      {[](DatasetOptions* o) {
         o->format = DataFormat::kCsv;
         o->columns = {{"a"}, {"a"}};
       },
       "columns[1].name: 'a' is declared twice"},
      {[](DatasetOptions* o) {
         o->format = DataFormat::kCsv;
         o->columns = {{"label"}};
       },
       "columns[0].name: 'label' is the label column"},
      {[](DatasetOptions* o) {
         o->format = DataFormat::kTsv;
         o->columns = {{"a", ColumnKind::kDense, 0, 100}};
       },
       "columns[0].buckets: only a categorical column has buckets"},
  };
  for (const auto& [mutate, message] : cases) {
    DatasetOptions o = Good();
    mutate(&o);
    absl::Status s = Validate(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_EQ(s.message(), message);
  }
}

TEST(DatasetOptionsTest, NamesAsTheJobFileSpellsThem) {
  EXPECT_EQ(*ParseDataFormat("svmlight"), DataFormat::kLibSvm);
  EXPECT_EQ(*ParseDataFormat("criteo"), DataFormat::kCriteo);
  EXPECT_EQ(*ParseOnError("skip"), OnError::kSkip);
  EXPECT_EQ(*ParseSplitMode("bytes"), SplitMode::kBytes);
  EXPECT_EQ(*ParseColumnKind("categorical"), ColumnKind::kCategorical);
  EXPECT_EQ(*ParseDenseTransform("log1p"), DenseTransform::kLog1p);
  for (DataFormat f :
       {DataFormat::kLibSvm, DataFormat::kCsv, DataFormat::kTsv, DataFormat::kCriteo}) {
    EXPECT_EQ(*ParseDataFormat(DataFormatName(f)), f);
  }
  auto bad = ParseDataFormat("parquet");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "format: 'parquet' is not one of libsvm, svmlight, csv, tsv, criteo");
  EXPECT_EQ(ParseOnError("ignore").status().message(),
            "on_error: 'ignore' is not one of fail, skip");
}

}  // namespace
}  // namespace pscluster::data
