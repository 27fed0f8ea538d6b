// The protocols a server's Job is composed of, each on its own: a rank's clocks and fences
// (WorkerClocks), the consistency gate (ReadGate), the exactly-once record (AppliedRecord) and
// synchronous aggregation (StepAggregator). Job's own tests (ps_handler_*_test) cover them
// working together.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/applied_record.h"
#include "server/read_gate.h"
#include "server/step_aggregator.h"
#include "server/worker_clocks.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ------------------------------------------------------------------ WorkerClocks

TEST(WorkerClocksTest, TheSlowestRankStillInTheJobSetsTheMinimum) {
  WorkerClocks c("j", 3);
  EXPECT_EQ(c.Min(), 0);
  EXPECT_FALSE(c.Complete(0, 0)) << "ranks 1 and 2 are still at 0";
  EXPECT_FALSE(c.Complete(1, 0));
  EXPECT_TRUE(c.Complete(2, 0)) << "the last rank to finish step 0 moves the minimum";
  EXPECT_EQ(c.Min(), 1);
  EXPECT_FALSE(c.Complete(2, 0)) << "completing a step again changes nothing";
  EXPECT_EQ(c.clock(2), 1);
  EXPECT_TRUE(c.Complete(0, 1) == false && c.Max() == 2);
  EXPECT_EQ(c.MinOfOthers(0), 1);
  bool newly = false;
  ASSERT_TRUE(c.Leave(1, &newly).ok());
  EXPECT_TRUE(newly);
  EXPECT_EQ(c.Min(), 1) << "rank 2 is still at 1";
  EXPECT_EQ(c.MinOfOthers(2), 2) << "rank 1 left: only rank 0 counts besides rank 2";
}

TEST(WorkerClocksTest, AFencedAttemptIsAbortedNamingTheNewerOne) {
  WorkerClocks c("job-a", 2);
  c.Complete(1, 0);
  EXPECT_EQ(c.Fence(1, 3), std::make_pair(int64_t{1}, uint32_t{3}));
  EXPECT_EQ(c.Fence(1, 2), std::make_pair(int64_t{1}, uint32_t{3})) << "a fence never lowers";
  EXPECT_EQ(c.Fence(7, 1), std::make_pair(int64_t{-1}, uint32_t{0})) << "outside the job";
  absl::Status st = c.CheckAttempt(1, 2, "tag.attempt");
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(st.message(), HasSubstr("tag.attempt: rank 1 of job 'job-a' was handed to a newer "
                                      "task (attempt 3); this task (attempt 2)"));
  EXPECT_TRUE(c.CheckAttempt(1, 3, "tag.attempt").ok());
  EXPECT_TRUE(c.CheckAttempt(0, 0, "tag.attempt").ok());
  c.FenceAll(5);
  EXPECT_EQ(c.CheckAttempt(0, 4, "attempt").code(), absl::StatusCode::kAborted);
}

TEST(WorkerClocksTest, TheLastRankCannotLeaveAndALeftRankRejoinsAtTheSlowestOtherClock) {
  WorkerClocks c("j", 2);
  c.Complete(0, 0);
  c.Complete(0, 1);  // Rank 0 at 2, rank 1 at 0.
  bool newly = false;
  auto left = c.Leave(1, &newly);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(*left, 0);
  EXPECT_EQ(c.Min(), 2) << "a rank that left gates nothing";
  EXPECT_THAT(c.LeftWorkers(), ElementsAre(1));
  auto again = c.Leave(1, &newly);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(newly) << "leaving twice is not a second leave";
  EXPECT_EQ(c.CheckAttempt(1, 100, "tag.attempt").code(), absl::StatusCode::kAborted);
  EXPECT_THAT(c.CheckAttempt(1, 100, "tag.attempt").message(), HasSubstr("has left job 'j'"));
  auto last = c.Leave(0, &newly);
  EXPECT_EQ(last.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(last.status().message(), HasSubstr("last rank of job 'j'"));
  EXPECT_EQ(c.Leave(5, &newly).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Rejoin(0, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  auto back = c.Rejoin(1, 4);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, 2);
  EXPECT_EQ(c.clock(1), 2);
  EXPECT_FALSE(c.HasLeft(1));
  EXPECT_EQ(c.CheckAttempt(1, 3, "a").code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(c.CheckAttempt(1, 4, "a").ok());
}

TEST(WorkerClocksTest, UnknownClocksAreSetByTheFirstPushOrByACopy) {
  WorkerClocks c("j", 3);
  c.MarkUnknown();
  c.ObservePush(0, 7);
  EXPECT_EQ(c.clock(0), 7);
  c.ObservePush(0, 9);
  EXPECT_EQ(c.clock(0), 7) << "only the first push sets it";
  c.Join({5, 4, 6});
  EXPECT_THAT(c.clocks(), ElementsAre(5, 4, 6))
      << "a known clock takes the lower one, an unknown one the copy's";
  c.Join({9, 1, 9});
  EXPECT_THAT(c.clocks(), ElementsAre(5, 1, 6));
  c.SetAll(3);
  EXPECT_THAT(c.clocks(), ElementsAre(3, 3, 3));
  c.ObservePush(1, 10);
  EXPECT_EQ(c.clock(1), 3) << "after SetAll every clock is known";
}

// ------------------------------------------------------------------ ReadGate

v1::ConsistencySpec Mode(v1::ConsistencySpec::Mode mode, uint32_t staleness = 0,
                         bool aggregate = false) {
  v1::ConsistencySpec spec;
  spec.set_mode(mode);
  spec.set_staleness(staleness);
  spec.set_aggregate(aggregate);
  return spec;
}

TEST(ReadGateTest, EachModeNeedsWhatItPromises) {
  EXPECT_EQ(ReadGate(Mode(v1::ConsistencySpec::BSP)).NeedFor(5), 5);
  EXPECT_EQ(ReadGate(Mode(v1::ConsistencySpec::SSP, 2)).NeedFor(5), 3);
  EXPECT_EQ(ReadGate(Mode(v1::ConsistencySpec::ASP)).NeedFor(5),
            std::numeric_limits<int64_t>::min());
  ReadGate bsp(Mode(v1::ConsistencySpec::BSP));
  EXPECT_TRUE(bsp.Admits(0));
  EXPECT_FALSE(bsp.Admits(1));
  ReadGate asp(Mode(v1::ConsistencySpec::ASP));
  EXPECT_TRUE(asp.Admits(1000));
}

TEST(ReadGateTest, ParkedReadsAreReleasedInOrderOfNeedAndCancelledOnesNever) {
  ReadGate g(Mode(v1::ConsistencySpec::SSP, 1));
  std::vector<int> order;
  auto cb = [&order](int tag) { return [&order, tag](absl::Status) { order.push_back(tag); }; };
  g.Park(4, cb(4));  // Needs 3.
  uint64_t cancelled = g.Park(2, cb(2));  // Needs 1.
  g.Park(3, cb(3));  // Needs 2.
  EXPECT_EQ(g.parked(), 3u);
  EXPECT_EQ(g.MaxParkedNeed(), 3);
  EXPECT_TRUE(g.Cancel(cancelled));
  EXPECT_FALSE(g.Cancel(cancelled)) << "already gone";
  std::vector<ReadGate::Callback> ready;
  g.Release(2, &ready);
  ASSERT_EQ(ready.size(), 1u);
  for (auto& r : ready) r(absl::OkStatus());
  EXPECT_THAT(order, ElementsAre(3));
  ready.clear();
  g.Release(1, &ready);
  EXPECT_TRUE(ready.empty());
  EXPECT_EQ(g.released(), 2) << "the released clock never goes down by Release";
  g.Lower(1);
  EXPECT_EQ(g.released(), 1) << "but a joined copy's slower clocks lower it";
  auto rest = g.TakeAll();
  EXPECT_EQ(rest.size(), 1u);
  EXPECT_EQ(g.parked(), 0u);
  EXPECT_EQ(g.MaxParkedNeed(), std::numeric_limits<int64_t>::min());
}

TEST(ReadGateTest, AReadAfterItsOwnPushWaitsOnlyForTheOtherRanks) {
  ReadGate bsp(Mode(v1::ConsistencySpec::BSP));
  int64_t reflects = -1;
  // Rank pushed the end of step 4 and reads at clock 5: the others must be at 5.
  EXPECT_FALSE(bsp.AdmitsAfterOwnPush(5, 4, 5, 4, &reflects));
  EXPECT_TRUE(bsp.AdmitsAfterOwnPush(5, 4, 5, 5, &reflects));
  EXPECT_EQ(reflects, 5);
  EXPECT_FALSE(bsp.AdmitsAfterOwnPush(5, 3, 4, 9, &reflects))
      << "its own step 4 would not be in the read";
  ReadGate agg(Mode(v1::ConsistencySpec::BSP, 0, /*aggregate=*/true));
  EXPECT_FALSE(agg.AdmitsAfterOwnPush(5, 4, 5, 9, &reflects))
      << "under aggregation updates land only when the step completes everywhere";
}

TEST(ReadGateTest, StalenessIsHowFarTheReaderWasAhead) {
  ReadGate g(Mode(v1::ConsistencySpec::ASP));
  g.RecordServed(5, 2);
  g.RecordServed(3, 3);
  g.RecordServed(1, 4);  // Behind: counts as 0.
  EXPECT_DOUBLE_EQ(g.mean_staleness(), 1.0);
  EXPECT_EQ(g.max_staleness(), 3);
}

// ------------------------------------------------------------------ AppliedRecord

TEST(AppliedRecordTest, AChunkIsAppliedOnceAndAStepBelowTheClockNever) {
  AppliedRecord r(2);
  const uint64_t a = AppliedRecord::ChunkIdentity(1, 0, true, 3, 0, 0, 100);
  const uint64_t b = AppliedRecord::ChunkIdentity(2, 0, true, 3, 0, 0, 100);
  EXPECT_NE(a, b);
  EXPECT_NE(a, AppliedRecord::ChunkIdentity(1, 0, true, 3, 0, 100, 100)) << "another offset";
  EXPECT_TRUE(r.Record(0, 5, 5, a));
  EXPECT_FALSE(r.Record(0, 5, 5, a)) << "the same chunk again is a duplicate";
  EXPECT_TRUE(r.Record(1, 5, 5, a)) << "records are per rank";
  EXPECT_FALSE(r.Record(0, 4, 5, b)) << "a step the clock has passed is a duplicate";
  r.Forget(0, 5, a);
  EXPECT_TRUE(r.Record(0, 5, 5, a)) << "a chunk whose update failed may come again";
}

TEST(AppliedRecordTest, TheStepJustCompletedIsRememberedOneStepLonger) {
  AppliedRecord r(1);
  r.Record(0, 3, 3, 11);
  r.Record(0, 4, 3, 12);
  r.Trim(0, 4);  // Completed step 3.
  EXPECT_EQ(r.all()[0].count(3), 1u) << "kept for a copy that takes over without step 3";
  r.Trim(0, 5);
  EXPECT_EQ(r.all()[0].count(3), 0u);
  EXPECT_EQ(r.all()[0].count(4), 1u);
  AppliedRecord::Steps other;
  other[4].insert(13);
  other[2].insert(99);
  r.Join(0, other, 5);
  EXPECT_EQ(r.all()[0].at(4).size(), 2u) << "the two copies' records unite";
  EXPECT_EQ(r.all()[0].count(2), 0u) << "and are trimmed to the joined clock";
  r.ClearAll();
  EXPECT_TRUE(r.all()[0].empty());
}

// ------------------------------------------------------------------ StepAggregator

TEST(StepAggregatorTest, SumsAreKeptPerStepAndTakenOnceEveryRankCompletedThem) {
  StepAggregator agg;
  auto add = [](float v) {
    return [v](float* sum) {
      for (int i = 0; i < 4; ++i) sum[i] += v * (i + 1);
    };
  };
  agg.AddDense(0, 0, 7, 4, add(1));
  agg.AddDense(0, 0, 7, 4, add(2));
  agg.AddDense(1, 0, 7, 4, add(10));
  const uint64_t keys[] = {5, 9, 5};
  const float rows[] = {1, 1, 2, 2, 3, 3};
  agg.AddSparse(0, 1, 2, keys, rows);
  EXPECT_EQ(agg.pending_steps(), 2u);
  EXPECT_TRUE(agg.TakeBefore(0).empty());
  auto taken = agg.TakeBefore(1);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].first, 0);
  {
    StepAggregator::Step& s = *taken[0].second;
    absl::MutexLock l(&s.mu);
    EXPECT_THAT(s.dense.at({0, 7}), ElementsAre(3, 6, 9, 12));
    EXPECT_THAT(s.sparse.at(1).at(5), ElementsAre(4, 4)) << "a key listed twice adds twice";
    EXPECT_THAT(s.sparse.at(1).at(9), ElementsAre(2, 2));
  }
  EXPECT_EQ(agg.pending_steps(), 1u);
  agg.Recycle(taken[0].second.get());
  EXPECT_EQ(agg.spares(), 1u);
  agg.AddDense(2, 0, 8, 4, add(1));
  EXPECT_EQ(agg.spares(), 0u) << "the next step's block reuses the spare";
  auto two = agg.TakeBefore(3);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].first, 1);
  absl::MutexLock l(&two[1].second->mu);
  EXPECT_THAT(two[1].second->dense.at({0, 8}), ElementsAre(1, 2, 3, 4))
      << "a reused buffer starts from zeros";
}

TEST(StepAggregatorTest, ClearForgetsEveryStep) {
  StepAggregator agg;
  agg.AddDense(4, 0, 0, 2, [](float* s) { s[0] = 1; });
  agg.Clear();
  EXPECT_EQ(agg.pending_steps(), 0u);
  EXPECT_TRUE(agg.TakeBefore(100).empty());
}

}  // namespace
}  // namespace pscluster
