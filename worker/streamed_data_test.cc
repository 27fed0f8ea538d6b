#include "worker/streamed_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/data/test_files.h"

namespace pscluster::worker {
namespace {

// `n` LibSVM lines of one byte length each (so a byte split halves them exactly): line i is
// "<i % 2> <1000 + i>:1", its example's only key 1000 + i.
std::string Lines(int n, int first = 0) {
  std::string text;
  for (int i = first; i < first + n; ++i) {
    absl::StrAppend(&text, i % 2, " ", absl::StrFormat("%04d", 1000 + i), ":1\n");
  }
  return text;
}

class StreamedDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = data::testing::NewTempDir("streamed");
    data::testing::WriteText(dir_ + "/train.svm", Lines(2000));
    data::testing::WriteText(dir_ + "/test.svm", Lines(50, 5000));
  }

  v1::JobSpec Spec() {
    v1::JobSpec spec;
    spec.set_seed(3);
    spec.mutable_model()->set_kind("sparse_linear");
    v1::DatasetSpec* d = spec.mutable_dataset();
    d->set_format("libsvm");
    d->set_train(dir_ + "/train.svm");
    d->set_test(dir_ + "/test.svm");
    d->set_index_base(0);
    d->set_num_features(10000);
    d->set_shuffle_window(16);
    d->set_batch_examples(8);
    d->set_chunk_bytes(4096);  // The smallest: a part of 1,000 lines is 3 chunks.
    return spec;
  }

  std::unique_ptr<StreamedData> Open(const v1::JobSpec& spec) {
    auto d = OpenStreamedData(spec);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? std::move(*d) : nullptr;
  }

  static data::PartitionSpec Part(uint32_t index, uint32_t count) {
    data::PartitionSpec p;
    p.index = index;
    p.count = count;
    return p;
  }

  // The keys of a batch's examples (one per example), in order.
  static std::vector<uint64_t> Keys(const kernels::Batch& b) {
    std::vector<uint64_t> out;
    for (int64_t i = 0; i < b.num_examples; ++i) {
      EXPECT_EQ(b.offsets[i + 1] - b.offsets[i], 1u);
      out.push_back(b.keys[b.offsets[i]]);
      EXPECT_EQ(b.labels[i], static_cast<int32_t>((b.keys[b.offsets[i]] - 1000) % 2));
    }
    return out;
  }

  std::string dir_;
};

TEST_F(StreamedDataTest, OpensCountsAndFillsTheModelFromTheSchema) {
  auto d = Open(Spec());
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->train_lines, 2000);
  EXPECT_TRUE(d->dataset->has_test());
  EXPECT_NE(d->Describe().find("2000 training lines"), std::string::npos) << d->Describe();
  v1::ModelSpec m = CompleteStreamedModelSpec(Spec().model(), d->dataset->schema());
  EXPECT_EQ(m.input_dim(), 10000u);
  EXPECT_EQ(m.num_classes(), 2u);
  v1::ModelSpec mlp;
  mlp.set_kind("mlp");
  mlp.set_num_classes(5);
  EXPECT_EQ(CompleteStreamedModelSpec(mlp, d->dataset->schema()).input_dim(), 0u);  // No dense.
  EXPECT_EQ(CompleteStreamedModelSpec(mlp, d->dataset->schema()).num_classes(), 5u);
}

TEST_F(StreamedDataTest, MissingFilesAndEmptyPartsAreNamed) {
  v1::JobSpec spec = Spec();
  spec.mutable_dataset()->set_train(dir_ + "/absent.svm");
  auto d = OpenStreamedData(spec);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("absent.svm"), std::string::npos) << d.status();
  // More ranks than lines: a part with no lines says so.
  data::testing::WriteText(dir_ + "/two.svm", Lines(2));
  spec.mutable_dataset()->set_train(dir_ + "/two.svm");
  auto small = Open(spec);
  ASSERT_NE(small, nullptr);
  auto s = StreamedTrainSource::Create(small.get(), Part(3, 4), 1, 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
}

// Two ranks over one epoch read every line exactly once, in a seeded order that differs by
// epoch; the same seed gives the same batches.
TEST_F(StreamedDataTest, TwoRanksCoverTheSetOncePerEpoch) {
  auto d = Open(Spec());
  ASSERT_NE(d, nullptr);
  const Schedule sch = ScheduleFor(d->train_lines, 2, 100, 2);
  ASSERT_EQ(sch.steps_per_epoch, 10);
  std::vector<uint64_t> epoch_keys[2];
  std::vector<uint64_t> rank0_epoch0;
  for (uint32_t r = 0; r < 2; ++r) {
    auto s = StreamedTrainSource::Create(d.get(), Part(r, 2), 100, sch.steps_per_epoch);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->examples(), 1000);
    EXPECT_EQ((*s)->batch(), 100);
    for (int64_t n = 0; n < sch.total_steps; ++n) {
      auto b = (*s)->BatchFor(n);
      ASSERT_TRUE(b.ok()) << b.status();
      ASSERT_EQ(b->num_examples, 100);
      for (uint64_t k : Keys(*b)) {
        epoch_keys[n / sch.steps_per_epoch].push_back(k);
        if (r == 0 && n < sch.steps_per_epoch) rank0_epoch0.push_back(k);
      }
    }
  }
  for (auto& keys : epoch_keys) {
    std::vector<uint64_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(sorted.size(), 2000u);
    for (uint64_t i = 0; i < 2000; ++i) ASSERT_EQ(sorted[i], 1000 + i);
  }
  EXPECT_NE(epoch_keys[0], epoch_keys[1]) << "each epoch reads in its own order";
  // Shuffled: not the file order.
  EXPECT_FALSE(std::is_sorted(rank0_epoch0.begin(), rank0_epoch0.end()));
  // Deterministic by seed.
  auto again = StreamedTrainSource::Create(d.get(), Part(0, 2), 100, sch.steps_per_epoch);
  ASSERT_TRUE(again.ok());
  std::vector<uint64_t> replay;
  for (int64_t n = 0; n < sch.steps_per_epoch; ++n) {
    auto b = (*again)->BatchFor(n);
    ASSERT_TRUE(b.ok());
    for (uint64_t k : Keys(*b)) replay.push_back(k);
  }
  EXPECT_EQ(replay, rank0_epoch0);
}

// A task that starts mid-epoch (a hand-over, a restore) reads what the task before it would
// have: the batches of the steps it runs are those of a task that ran from step 0.
TEST_F(StreamedDataTest, AStartMidEpochReadsTheSameBatches) {
  auto d = Open(Spec());
  ASSERT_NE(d, nullptr);
  auto from0 = StreamedTrainSource::Create(d.get(), Part(1, 2), 100, 10);
  ASSERT_TRUE(from0.ok());
  std::map<int64_t, std::vector<uint64_t>> want;
  for (int64_t n = 0; n < 20; ++n) {
    auto b = (*from0)->BatchFor(n);
    ASSERT_TRUE(b.ok());
    want[n] = Keys(*b);
  }
  for (int64_t start : {4, 10, 13}) {
    auto s = StreamedTrainSource::Create(d.get(), Part(1, 2), 100, 10);
    ASSERT_TRUE(s.ok());
    for (int64_t n = start; n < 20; ++n) {
      auto b = (*s)->BatchFor(n);
      ASSERT_TRUE(b.ok());
      EXPECT_EQ(Keys(*b), want[n]) << "start " << start << " step " << n;
    }
  }
}

// A part smaller than the epoch's steps read starts over within the epoch, in the same order.
TEST_F(StreamedDataTest, ASmallPartWrapsAroundWithinTheEpoch) {
  auto d = Open(Spec());
  ASSERT_NE(d, nullptr);
  // The whole set (2,000 lines) read as 30 steps of 100: the last 10 steps repeat the first 10.
  auto s = StreamedTrainSource::Create(d.get(), Part(0, 1), 100, 30);
  ASSERT_TRUE(s.ok());
  std::vector<std::vector<uint64_t>> steps;
  for (int64_t n = 0; n < 30; ++n) {
    auto b = (*s)->BatchFor(n);
    ASSERT_TRUE(b.ok()) << b.status();
    steps.push_back(Keys(*b));
  }
  for (int j = 0; j < 10; ++j) EXPECT_EQ(steps[20 + j], steps[j]) << j;
}

// The part of a rank that left, handed over mid-epoch, is read from the next batch on; the
// epoch then covers both parts.
TEST_F(StreamedDataTest, APartHandedOverIsReadInTheSameEpoch) {
  v1::JobSpec spec = Spec();
  auto d = Open(spec);
  ASSERT_NE(d, nullptr);
  auto s = StreamedTrainSource::Create(d.get(), Part(0, 2), 100, 20);
  ASSERT_TRUE(s.ok());
  std::set<uint64_t> seen;
  auto b = (*s)->BatchFor(0);
  ASSERT_TRUE(b.ok());
  for (uint64_t k : Keys(*b)) seen.insert(k);
  data::PartitionSpec both = Part(0, 2);
  both.also = {1};
  auto msg = (*s)->Repartition(both);
  ASSERT_TRUE(msg.ok()) << msg.status();
  EXPECT_NE(msg->find("now reads 2000 lines"), std::string::npos) << *msg;
  EXPECT_EQ((*s)->examples(), 2000);
  EXPECT_EQ((*s)->batch(), 200);
  for (int64_t n = 1; n < 20 && seen.size() < 2000; ++n) {
    auto next = (*s)->BatchFor(n);
    ASSERT_TRUE(next.ok()) << next.status();
    for (uint64_t k : Keys(*next)) seen.insert(k);
  }
  EXPECT_EQ(seen.size(), 2000u) << "both parts read in the epoch";
}

// Data balancing gives the ranks shares of the set (3 : 1 here, the faster rank the larger):
// each reads its share's part of the user's files with a batch sized to match, and the two
// still cover the set once per epoch, as with equal parts.
TEST_F(StreamedDataTest, SharesSizeEachRanksPartAndTheRanksStillCoverTheSetOnce) {
  auto d = Open(Spec());
  ASSERT_NE(d, nullptr);
  const Schedule sch = ScheduleFor(d->train_lines, 2, 100, 1);
  ASSERT_EQ(sch.steps_per_epoch, 10);
  std::vector<uint64_t> keys;
  int64_t examples[2] = {0, 0};
  for (uint32_t r = 0; r < 2; ++r) {
    data::PartitionSpec part = Part(r, 2);
    part.shares = {3, 1};
    auto s = StreamedTrainSource::Create(d.get(), part, 100, sch.steps_per_epoch);
    ASSERT_TRUE(s.ok()) << s.status();
    examples[r] = (*s)->examples();
    EXPECT_EQ((*s)->batch(), r == 0 ? 150 : 50) << "rank " << r;
    for (int64_t n = 0; n < sch.steps_per_epoch; ++n) {
      auto b = (*s)->BatchFor(n);
      ASSERT_TRUE(b.ok()) << b.status();
      for (uint64_t k : Keys(*b)) keys.push_back(k);
    }
  }
  EXPECT_EQ(examples[0], 1500);
  EXPECT_EQ(examples[1], 500);
  std::sort(keys.begin(), keys.end());
  ASSERT_EQ(keys.size(), 2000u);
  for (uint64_t i = 0; i < 2000; ++i) ASSERT_EQ(keys[i], 1000 + i) << "each line once";
}

TEST_F(StreamedDataTest, TheTestSetIsReadInFileOrderEachPass) {
  auto d = Open(Spec());
  ASSERT_NE(d, nullptr);
  StreamedTestSource test(d.get());
  EXPECT_FALSE(test.Next(10).ok()) << "Next before Start";
  for (int pass = 0; pass < 2; ++pass) {
    ASSERT_TRUE(test.Start().ok());
    std::vector<uint64_t> keys;
    while (true) {
      auto b = test.Next(7);
      ASSERT_TRUE(b.ok()) << b.status();
      if (b->num_examples == 0) break;
      EXPECT_LE(b->num_examples, 7);
      for (uint64_t k : Keys(*b)) keys.push_back(k);
    }
    ASSERT_EQ(keys.size(), 50u);
    for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(keys[i], 6000 + i);
  }
}

TEST_F(StreamedDataTest, AMalformedLineFailsTheBatchNamingFileAndLine) {
  data::testing::WriteText(dir_ + "/bad.svm", Lines(5) + "1 1007=1\n" + Lines(5, 10));
  v1::JobSpec spec = Spec();
  spec.mutable_dataset()->set_train(dir_ + "/bad.svm");
  spec.mutable_dataset()->set_shuffle_window(0);
  auto d = Open(spec);
  ASSERT_NE(d, nullptr);
  auto s = StreamedTrainSource::Create(d.get(), Part(0, 1), 11, 1);
  ASSERT_TRUE(s.ok());
  auto b = (*s)->BatchFor(0);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(b.status().message().find("bad.svm:6:"), std::string::npos) << b.status();
}

// on_error: skip: a malformed line is counted (the task's status and /metrics show it) and the
// batch holds the other lines.
TEST_F(StreamedDataTest, SkippedLinesAreCountedInTheSourcesStats) {
  data::testing::WriteText(dir_ + "/bad.svm", Lines(5) + "1 1007=1\n" + Lines(5, 10));
  v1::JobSpec spec = Spec();
  spec.mutable_dataset()->set_train(dir_ + "/bad.svm");
  spec.mutable_dataset()->set_on_error("skip");
  spec.mutable_dataset()->set_max_error_fraction(0.5);
  auto d = Open(spec);
  ASSERT_NE(d, nullptr);
  auto s = StreamedTrainSource::Create(d.get(), Part(0, 1), 10, 1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->stats().bytes_read, 0u);
  auto b = (*s)->BatchFor(0);
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<uint64_t> keys = Keys(*b);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<uint64_t>{1000, 1001, 1002, 1003, 1004, 1010, 1011, 1012, 1013,
                                         1014}));
  // The reader may still be finishing its pass: wait for the count.
  for (int i = 0; i < 200 && (*s)->stats().skipped_lines == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*s)->stats().skipped_lines, 1u);
  EXPECT_GT((*s)->stats().bytes_read, 0u);
}

}  // namespace
}  // namespace pscluster::worker
