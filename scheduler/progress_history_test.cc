#include "scheduler/progress_history.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster::scheduler {
namespace {

using ::testing::HasSubstr;

absl::Time At(int64_t ms) { return absl::FromUnixMillis(ms); }

v1::Job Running(int64_t step, double loss) {
  v1::Job job;
  job.set_job_id("job-1");
  job.set_state(v1::JOB_RUNNING);
  v1::JobProgress* p = job.mutable_progress();
  p->set_step(step);
  p->set_loss(loss);
  p->set_test_accuracy(-1);
  v1::WorkerProgress* w = p->add_workers();
  w->set_updated_unix_ms(1);
  w->set_test_auc(-1);
  return job;
}

TEST(ProgressHistoryTest, NoPointBeforeTheFirstReport) {
  ProgressHistory h;
  v1::Job job = Running(0, 0);
  job.set_state(v1::JOB_QUEUED);
  job.mutable_progress()->mutable_workers(0)->set_updated_unix_ms(0);
  h.Observe(job, At(1000));
  EXPECT_EQ(h.history().points_size(), 0);
  ASSERT_EQ(h.history().events_size(), 1);
  EXPECT_EQ(h.history().events(0).kind(), v1::JOB_EVENT_STATE);
  EXPECT_THAT(h.history().events(0).text(), HasSubstr("queued"));
}

TEST(ProgressHistoryTest, OnePointPerStepAndTheLatestLookReplacesItsStep) {
  ProgressHistory h;
  h.Observe(Running(1, 2.0), At(1000));
  h.Observe(Running(2, 1.5), At(2000));
  h.Observe(Running(2, 1.4), At(2500));  // Another rank's report at the same step.
  h.Observe(Running(3, 1.0), At(3000));
  const v1::JobHistory& got = h.history();
  ASSERT_EQ(got.points_size(), 3);
  EXPECT_EQ(got.points(1).step(), 2);
  EXPECT_EQ(got.points(1).loss(), 1.4);
  EXPECT_EQ(got.points(1).unix_ms(), 2500);
  EXPECT_EQ(got.points(2).step(), 3);
  EXPECT_EQ(got.points(0).test_auc(), -1);
}

// Test AUC comes from the rank that evaluated; before any evaluation it is unknown (-1), even
// though a rank that has not evaluated reports 0.
TEST(ProgressHistoryTest, TestAucOfTheEvaluatingRank) {
  ProgressHistory h;
  v1::Job job = Running(1, 1.0);
  job.mutable_progress()->mutable_workers(0)->set_test_auc(0);
  job.mutable_progress()->mutable_workers(0)->set_test_accuracy(-1);
  h.Observe(job, At(1000));
  EXPECT_EQ(h.history().points(0).test_auc(), -1);
  job = Running(2, 0.9);
  job.mutable_progress()->mutable_workers(0)->set_test_accuracy(0.8);
  job.mutable_progress()->mutable_workers(0)->set_test_auc(0.91);
  h.Observe(job, At(2000));
  EXPECT_EQ(h.history().points(1).test_auc(), 0.91);
}

TEST(ProgressHistoryTest, BoundedAndSpreadOverTheWholeRun) {
  ProgressHistory h;
  const int64_t steps = 10 * ProgressHistory::kMaxPoints + 7;
  for (int64_t s = 1; s <= steps; ++s) h.Observe(Running(s, 1.0 / s), At(s));
  const v1::JobHistory& got = h.history();
  EXPECT_LE(got.points_size(), ProgressHistory::kMaxPoints);
  EXPECT_GE(got.points_size(), ProgressHistory::kMaxPoints / 2);
  EXPECT_EQ(got.points(0).step(), 1);                       // The start stays...
  EXPECT_EQ(got.points(got.points_size() - 1).step(), steps);  // ...and so does the latest.
  EXPECT_EQ(got.step_spacing(), 16u);
  for (int i = 1; i < got.points_size(); ++i) {
    ASSERT_GT(got.points(i).step(), got.points(i - 1).step());
    ASSERT_LE(got.points(i).step() - got.points(i - 1).step(), 2 * got.step_spacing());
  }
}

TEST(ProgressHistoryTest, RecoveriesMovesAndBalanceBecomeEvents) {
  ProgressHistory h;
  v1::Job job = Running(10, 1.0);
  h.Observe(job, At(1000));
  job.mutable_recovery()->set_handovers(1);
  job.mutable_recovery()->set_last_cause("worker-2 stopped heartbeating");
  h.Observe(job, At(2000));
  job.set_state(v1::JOB_RECOVERING);
  job.mutable_recovery()->set_recoveries(1);
  job.mutable_recovery()->set_start_step(5);
  h.Observe(job, At(3000));
  v1::ShardMove* m = job.add_moves();
  m->set_shard(3);
  m->set_from("server-1");
  m->set_to("server-2");
  m->set_state(v1::MOVE_DONE);
  m->set_finished_unix_ms(3500);
  job.mutable_recovery()->set_rebalances(1);
  job.mutable_recovery()->add_data_shares(1200);
  job.mutable_recovery()->add_data_shares(800);
  h.Observe(job, At(4000));
  h.Observe(job, At(5000));  // Nothing new.

  std::vector<v1::JobEventKind> kinds;
  for (const v1::JobEvent& e : h.history().events()) kinds.push_back(e.kind());
  EXPECT_THAT(kinds, ::testing::ElementsAre(v1::JOB_EVENT_STATE, v1::JOB_EVENT_HANDOVER,
                                            v1::JOB_EVENT_STATE, v1::JOB_EVENT_ROLLBACK,
                                            v1::JOB_EVENT_DATA_BALANCE, v1::JOB_EVENT_SHARD_MOVE));
  EXPECT_THAT(h.history().events(1).text(), HasSubstr("worker-2 stopped heartbeating"));
  EXPECT_EQ(h.history().events(3).step(), 5);
  EXPECT_THAT(h.history().events(4).text(), HasSubstr("1200,800"));
  EXPECT_THAT(h.history().events(5).text(), HasSubstr("shard 3 server-1 -> server-2 done"));
}

TEST(ProgressHistoryTest, EventsBounded) {
  ProgressHistory h;
  v1::Job job = Running(1, 1.0);
  for (int i = 0; i < ProgressHistory::kMaxEvents + 50; ++i) {
    job.set_state(i % 2 ? v1::JOB_RUNNING : v1::JOB_RECOVERING);
    h.Observe(job, At(i));
  }
  EXPECT_EQ(h.history().events_size(), ProgressHistory::kMaxEvents);
  EXPECT_EQ(h.history().events_dropped(), 50u);
}

}  // namespace
}  // namespace pscluster::scheduler
