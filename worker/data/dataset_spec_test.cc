// A job's dataset section read as the streaming reader's options: defaults, every key carried,
// and bad values named by their key.
#include "worker/data/dataset_spec.h"

#include <gtest/gtest.h>

namespace pscluster::data {
namespace {

void ExpectRefused(const v1::DatasetSpec& spec, const std::string& prefix) {
  auto o = DatasetOptionsOf(spec, 7);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(o.status().message().substr(0, prefix.size()), prefix) << o.status();
}

TEST(DatasetSpecTest, DefaultsAndTheJobsSeed) {
  v1::DatasetSpec spec;
  spec.set_format("libsvm");
  spec.set_train("/data/train.svm");
  auto o = DatasetOptionsOf(spec, 7);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->format, DataFormat::kLibSvm);
  EXPECT_EQ(o->seed, 7u);
  EXPECT_EQ(o->shuffle_window, 10000u);
  EXPECT_EQ(o->index_base, 1u);
  EXPECT_EQ(o->on_error, OnError::kFail);
  EXPECT_EQ(KeySpaceOf(*o), 0u) << "libsvm without num_features is unbounded";
}

TEST(DatasetSpecTest, EveryKeyIsCarried) {
  v1::DatasetSpec spec;
  spec.set_format("csv");
  spec.set_train("/d/*.csv");
  spec.set_test("/d/test.csv");
  spec.set_seed(3);
  spec.set_shuffle_window(0);
  spec.set_on_error("skip");
  spec.set_max_error_fraction(0.01);
  spec.set_num_classes(10);
  spec.set_label_base(1);
  spec.set_label_column("y");
  auto* c = spec.add_columns();
  c->set_name("city");
  c->set_kind("categorical");
  c->set_buckets(1000);
  c = spec.add_columns();
  c->set_name("age");
  c->set_default_value(30);
  spec.set_other_columns("ignore");
  spec.add_na_values("-");
  spec.set_hash_buckets(4096);
  spec.set_missing_value(-1);
  spec.set_dense_transform("log1p");
  spec.set_split("bytes");
  spec.set_chunk_bytes(1 << 20);
  spec.set_max_line_bytes(4096);
  spec.set_prefetch_batches(2);
  spec.set_batch_examples(64);
  auto o = DatasetOptionsOf(spec, 7);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->format, DataFormat::kCsv);
  EXPECT_EQ(o->test, "/d/test.csv");
  EXPECT_EQ(o->seed, 3u);
  EXPECT_EQ(o->shuffle_window, 0u);
  EXPECT_EQ(o->on_error, OnError::kSkip);
  EXPECT_DOUBLE_EQ(o->max_error_fraction, 0.01);
  EXPECT_EQ(o->num_classes, 10u);
  EXPECT_EQ(o->label_base, 1);
  EXPECT_EQ(o->label_column, "y");
  ASSERT_EQ(o->columns.size(), 2u);
  EXPECT_EQ(o->columns[0].kind, ColumnKind::kCategorical);
  EXPECT_EQ(o->columns[0].buckets, 1000u);
  EXPECT_EQ(o->columns[1].kind, ColumnKind::kDense);
  EXPECT_FLOAT_EQ(o->columns[1].default_value, 30);
  EXPECT_EQ(o->other_columns, ColumnKind::kIgnore);
  EXPECT_EQ(o->na_values, std::vector<std::string>{"-"});
  EXPECT_EQ(o->hash_buckets, 4096u);
  EXPECT_FLOAT_EQ(o->missing_value, -1);
  EXPECT_EQ(o->dense_transform, DenseTransform::kLog1p);
  EXPECT_EQ(o->split, SplitMode::kBytes);
  EXPECT_EQ(o->chunk_bytes, uint64_t{1} << 20);
  EXPECT_EQ(o->max_line_bytes, 4096u);
  EXPECT_EQ(o->prefetch_batches, 2u);
  EXPECT_EQ(o->batch_examples, 64u);
  EXPECT_EQ(KeySpaceOf(*o), 1000u);
}

TEST(DatasetSpecTest, BadValuesAreNamedByTheirKey) {
  v1::DatasetSpec spec;
  spec.set_format("parquet");
  spec.set_train("/d");
  ExpectRefused(spec, "dataset.format: 'parquet' is not one of");
  spec.set_format("criteo");
  spec.set_name("fashion_mnist");
  ExpectRefused(spec, "dataset.name: give either");
  spec.clear_name();
  spec.set_holdout_fraction(1.5);
  ExpectRefused(spec, "dataset.holdout_fraction:");
  spec.set_holdout_fraction(0.2);
  spec.set_on_error("ignore");
  ExpectRefused(spec, "dataset.on_error:");
  spec.clear_on_error();
  spec.add_columns()->set_name("x");
  ExpectRefused(spec, "dataset.columns:");
  spec.clear_columns();
  spec.set_format("csv");
  spec.add_columns()->set_kind("text");
  ExpectRefused(spec, "dataset.columns[0].kind: 'text' is not one of");
  spec.clear_columns();
  spec.clear_train();
  ExpectRefused(spec, "dataset.train:");
}

}  // namespace
}  // namespace pscluster::data
