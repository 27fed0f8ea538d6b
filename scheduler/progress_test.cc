#include "scheduler/progress.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/status_matchers.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

v1::JobSpec Spec(v1::ConsistencySpec::Mode mode, uint32_t staleness = 0) {
  v1::JobSpec s;
  s.set_batch_size(10);
  s.mutable_consistency()->set_mode(mode);
  s.mutable_consistency()->set_staleness(staleness);
  return s;
}

void Report(v1::JobProgress* p, uint32_t rank, int64_t step, double sps = 100,
            double loss = 1.0) {
  v1::WorkerProgress* w = p->mutable_workers(rank);
  w->set_step(step);
  w->set_total_steps(100);
  w->set_samples_per_sec(sps);
  w->set_loss(loss);
  w->set_updated_unix_ms(1);
}

TEST(ProgressTest, InitialProgressIsUnknown) {
  v1::JobProgress p = InitialProgress({"worker-1", "worker-2"});
  ASSERT_EQ(p.workers_size(), 2);
  EXPECT_EQ(p.workers(1).node_id(), "worker-2");
  EXPECT_EQ(p.test_accuracy(), -1);
  EXPECT_EQ(p.eta_sec(), -1);
  EXPECT_EQ(p.rolled_back_to_step(), -1);
}

TEST(ProgressTest, SummaryOfSlowestWorkerMeansAndSums) {
  v1::JobProgress p = InitialProgress({"a", "b", "c"});
  Report(&p, 0, 50, 100, 0.5);
  Report(&p, 1, 40, 50, 1.5);
  Report(&p, 2, 60, 100, 1.0);
  p.mutable_workers(2)->set_test_accuracy(0.8);
  Summarize(Spec(v1::ConsistencySpec::ASP), {}, &p);
  EXPECT_EQ(p.step(), 40);
  EXPECT_EQ(p.total_steps(), 100);
  EXPECT_DOUBLE_EQ(p.loss(), 1.0);
  EXPECT_DOUBLE_EQ(p.samples_per_sec(), 250);
  EXPECT_DOUBLE_EQ(p.test_accuracy(), 0.8);
  // Slowest remaining: rank 1 has 60 steps of 10 examples at 50/s = 12 s.
  EXPECT_DOUBLE_EQ(p.eta_sec(), 12);
  EXPECT_THAT(p.waiting_for(), IsEmpty());  // ASP never waits.
}

// A rank that left the job evaluates no more: the job reports the evaluating rank's accuracy
// (the lowest rank still in the job), not the last one the rank that left gave.
TEST(ProgressTest, TheEvaluationOfARankThatLeftIsNotTheJobs) {
  v1::JobProgress p = InitialProgress({"a", "b", "c"});
  Report(&p, 0, 50);
  Report(&p, 1, 60);
  Report(&p, 2, 60);
  p.mutable_workers(0)->set_test_accuracy(0.86);
  p.mutable_workers(0)->set_test_loss(0.4);
  p.mutable_workers(0)->set_left(true);
  Summarize(Spec(v1::ConsistencySpec::BSP), {}, &p);
  EXPECT_EQ(p.test_accuracy(), -1) << "rank 1 has not evaluated yet";
  p.mutable_workers(1)->set_test_accuracy(0.897);
  p.mutable_workers(1)->set_test_loss(0.3);
  Summarize(Spec(v1::ConsistencySpec::BSP), {}, &p);
  EXPECT_DOUBLE_EQ(p.test_accuracy(), 0.897);
  EXPECT_DOUBLE_EQ(p.test_loss(), 0.3);
}

TEST(ProgressTest, WaitingForUnderBspAndSsp) {
  v1::JobProgress p = InitialProgress({"a", "b", "c"});
  Report(&p, 0, 10);
  Report(&p, 1, 8);
  Report(&p, 2, 10);
  Summarize(Spec(v1::ConsistencySpec::BSP), {}, &p);
  EXPECT_THAT(p.waiting_for(), ElementsAre(1));
  Summarize(Spec(v1::ConsistencySpec::SSP, 2), {}, &p);
  EXPECT_THAT(p.waiting_for(), IsEmpty());  // Within the staleness bound.
  Summarize(Spec(v1::ConsistencySpec::SSP, 1), {}, &p);
  EXPECT_THAT(p.waiting_for(), ElementsAre(1));
  // The servers' view is merged in.
  Summarize(Spec(v1::ConsistencySpec::SSP, 2), {2, 7}, &p);
  EXPECT_THAT(p.waiting_for(), ElementsAre(2));  // 7 is not a rank of this job.
}

TEST(ProgressTest, RanksThatAreDoneAreNeitherWaitedForNorWaiting) {
  v1::JobProgress p = InitialProgress({"a", "b"});
  // Rank 1 finished; rank 0 evaluates the test set, its last report a few steps back.
  Report(&p, 0, 95);
  Report(&p, 1, 100);
  p.mutable_workers(1)->set_done(true);
  Summarize(Spec(v1::ConsistencySpec::BSP), {}, &p);
  EXPECT_THAT(p.waiting_for(), IsEmpty());
  // A server's stale view of a rank that has since reported done is dropped too.
  Summarize(Spec(v1::ConsistencySpec::BSP), {1}, &p);
  EXPECT_THAT(p.waiting_for(), IsEmpty());
  // A rank that completed every step (its done report still on the way) holds no one back.
  p.mutable_workers(1)->set_done(false);
  Summarize(Spec(v1::ConsistencySpec::BSP), {}, &p);
  EXPECT_THAT(p.waiting_for(), IsEmpty());
  // Three ranks, one finished: the two still training are compared with each other.
  v1::JobProgress q = InitialProgress({"a", "b", "c"});
  Report(&q, 0, 100);
  q.mutable_workers(0)->set_done(true);
  Report(&q, 1, 50);
  Report(&q, 2, 52);
  Summarize(Spec(v1::ConsistencySpec::BSP), {}, &q);
  EXPECT_THAT(q.waiting_for(), ElementsAre(1));
  // Everyone done: nobody is waited for, whatever the servers said last.
  for (int r = 0; r < 3; ++r) q.mutable_workers(r)->set_done(true);
  Summarize(Spec(v1::ConsistencySpec::BSP), {0, 1, 2}, &q);
  EXPECT_THAT(q.waiting_for(), IsEmpty());
}

TEST(ProgressTest, UnknownThroughputMeansUnknownEta) {
  v1::JobProgress p = InitialProgress({"a", "b"});
  Report(&p, 0, 10, 0);
  Report(&p, 1, 10);
  Summarize(Spec(v1::ConsistencySpec::BSP), {}, &p);
  EXPECT_EQ(p.eta_sec(), -1);
}

TEST(ProgressTest, ReportChecksNameTheField) {
  v1::WorkerProgress w;
  w.set_rank(2);
  EXPECT_THAT(CheckWorkerProgress(w, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("progress.rank")));
  w.set_rank(0);
  w.set_step(-1);
  EXPECT_THAT(CheckWorkerProgress(w, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("progress.step")));
  w.set_step(1);
  w.set_samples_per_sec(INFINITY);
  EXPECT_THAT(CheckWorkerProgress(w, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("progress.samples_per_sec")));
  w.set_samples_per_sec(1);
  w.set_loss(NAN);  // A diverging model is reported, not refused.
  EXPECT_THAT(CheckWorkerProgress(w, 2), IsOk());
}

}  // namespace
}  // namespace pscluster::scheduler
