// Per-element optimizer step counts: runs split and merge, the switch to one count per element,
// and validation of runs read back from a checkpoint.
#include "server/step_counts.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace pscluster {
namespace {

using StepRun = StepCounts::Run;

// Advances [offset, offset + n) and checks the stretches reported against a plain array.
void AdvanceAndCheck(StepCounts* c, std::vector<int64_t>* expect, uint64_t offset, uint64_t n) {
  for (uint64_t i = offset; i < offset + n; ++i) ++(*expect)[i];
  uint64_t next = offset;
  c->Advance(offset, n, [&](uint64_t first, uint64_t count, int64_t steps) {
    ASSERT_EQ(first, next) << "stretches are reported in order, without gaps";
    ASSERT_GT(count, 0u);
    for (uint64_t i = first; i < first + count; ++i) ASSERT_EQ((*expect)[i], steps) << i;
    next = first + count;
  });
  ASSERT_EQ(next, offset + n);
}

std::vector<int64_t> Expand(const StepCounts& c) {
  std::vector<int64_t> out;
  uint64_t start = 0;
  for (const StepRun& r : c.Runs()) {
    out.insert(out.end(), r.end - start, r.steps);
    start = r.end;
  }
  return out;
}

TEST(StepCountsTest, WholeBlockPushesKeepOneRun) {
  StepCounts c(100);
  std::vector<int64_t> expect(100, 0);
  for (int i = 0; i < 5; ++i) AdvanceAndCheck(&c, &expect, 0, 100);
  EXPECT_TRUE(c.uniform());
  EXPECT_EQ(c.max(), 5);
  EXPECT_EQ(c.Runs(), (std::vector<StepRun>{{100, 5}}));
}

TEST(StepCountsTest, ChunksInAnyOrderCountOneStepPerElement) {
  StepCounts c(100);
  std::vector<int64_t> expect(100, 0);
  AdvanceAndCheck(&c, &expect, 50, 50);  // Second half first.
  EXPECT_FALSE(c.uniform());
  EXPECT_EQ(c.Runs(), (std::vector<StepRun>{{50, 0}, {100, 1}}));
  AdvanceAndCheck(&c, &expect, 0, 50);
  EXPECT_TRUE(c.uniform());
  EXPECT_EQ(c.Runs(), (std::vector<StepRun>{{100, 1}}));
  AdvanceAndCheck(&c, &expect, 20, 10);
  EXPECT_EQ(c.Runs(), (std::vector<StepRun>{{20, 1}, {30, 2}, {100, 1}}));
  EXPECT_EQ(c.max(), 2);
}

TEST(StepCountsTest, RandomSlicesMatchAPlainArrayAcrossTheSwitchToPerElementCounts) {
  std::mt19937_64 rng(11);
  const uint64_t n = 5000;
  StepCounts c(n);
  std::vector<int64_t> expect(n, 0);
  for (int i = 0; i < 2000; ++i) {
    uint64_t off = rng() % n;
    uint64_t len = 1 + rng() % std::min<uint64_t>(n - off, i < 1000 ? 7 : n);
    AdvanceAndCheck(&c, &expect, off, len);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_EQ(Expand(c), expect);
  // Setting the runs back gives the same counts (a checkpoint round trip).
  StepCounts back(n);
  ASSERT_TRUE(back.SetRuns(c.Runs()).ok());
  EXPECT_EQ(Expand(back), expect);
}

TEST(StepCountsTest, BadRunsAreRefusedAndChangeNothing) {
  StepCounts c(10);
  std::vector<int64_t> expect(10, 0);
  AdvanceAndCheck(&c, &expect, 0, 4);
  const auto before = c.Runs();
  for (const auto& bad : std::vector<std::vector<StepRun>>{
           {}, {{5, 1}, {5, 2}, {10, 1}}, {{5, 1}, {9, 1}}, {{5, 1}, {12, 1}}, {{10, -1}}}) {
    absl::Status s = c.SetRuns(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("step_runs"), std::string::npos) << s;
    EXPECT_EQ(c.Runs(), before);
  }
}

}  // namespace
}  // namespace pscluster
