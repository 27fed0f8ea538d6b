// End to end with the real daemons: `psctl cancel` on a running job stops the real workers (they
// report themselves idle), frees the servers, ends the job CANCELLED (waiting for no one), and the
// next job then trains on the same workers.
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/e2e_cluster.h"

namespace pscluster::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(E2eCancelTest, CancelStopsTheRealWorkersAndTheNextJobRunsOnThem) {
  auto cluster = E2eCluster::Start("cancel");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;

  CommandResult submit =
      c.Psctl({"submit", c.WriteFile("long.yaml", FashionJobYaml("long", 60, ""))});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  ASSERT_EQ(absl::StripAsciiWhitespace(submit.output), "job-1");
  v1::Job seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    auto j = c.GetJob("job-1");
    if (j.ok()) seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= 20;
  })) << seen.DebugString() << c.LogTails();
  for (const char* w : {"worker-1", "worker-2"}) {
    // A call that fails to connect (a loaded machine) is asked again.
    absl::StatusOr<v1::WorkerStatus> s;
    ASSERT_TRUE(WaitFor(absl::Seconds(10), [&] {
      s = c.WorkerStatus(w);
      return s.ok();
    })) << w << ": " << s.status();
    EXPECT_TRUE(s->busy()) << w;
    EXPECT_EQ(s->job_id(), "job-1") << w;
  }

  // The scheduler's /metrics shows the running job and the nodes.
  auto metrics = c.SchedulerMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("pscluster_scheduler_nodes{role=\"worker\",state=\"alive\"} 2"));
  EXPECT_THAT(*metrics, HasSubstr("pscluster_scheduler_nodes{role=\"server\",state=\"alive\"} 2"));
  EXPECT_THAT(*metrics, HasSubstr("pscluster_scheduler_jobs{state=\"running\"} 1"));
  EXPECT_THAT(*metrics, HasSubstr("pscluster_job_step{job=\"job-1\",name=\"long\"} "));
  EXPECT_THAT(*metrics, HasSubstr("pscluster_scheduler_progress_reports_total "));

  CommandResult cancel = c.Psctl({"cancel", "job-1", "--reason=wrong learning rate"});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  EXPECT_THAT(cancel.output, HasSubstr("job-1 cancelled"));

  // The real workers stop: idle, their last task job-1, no error recorded.
  for (const char* w : {"worker-1", "worker-2"}) {
    absl::StatusOr<v1::WorkerStatus> s;
    EXPECT_TRUE(WaitFor(absl::Seconds(15), [&] {
      s = c.WorkerStatus(w);
      return s.ok() && !s->busy();
    })) << w << ": " << (s.ok() ? s->DebugString() : s.status().ToString()) << c.LogTails();
    if (!s.ok()) continue;
    EXPECT_EQ(s->job_id(), "job-1") << w;
    EXPECT_EQ(s->last_error(), "") << w;
  }
  // And stay stopped.
  int64_t step = c.WorkerStatus("worker-1")->step();
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(c.WorkerStatus("worker-1")->step(), step);
  // The servers let go of the job.
  for (const char* s : {"server-1", "server-2"}) {
    EXPECT_TRUE(WaitFor(absl::Seconds(10), [&] {
      auto st = c.ServerStatus(s);
      if (!st.ok()) return false;
      for (const v1::JobOnServer& j : st->jobs()) {
        if (j.job_id() == "job-1") return false;
      }
      return true;
    })) << s << " still holds job-1";
  }

  auto cancelled = c.JobViaPsctl("job-1");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_CANCELLED);
  EXPECT_EQ(cancelled->reason(), "cancelled: wrong learning rate");
  EXPECT_GT(cancelled->finished_unix_ms(), 0);
  EXPECT_THAT(cancelled->progress().waiting_for(), IsEmpty());
  CommandResult table = c.Psctl({"status", "job-1"});
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(table.output, HasSubstr("cancelled"));
  EXPECT_THAT(table.output, Not(HasSubstr("waiting for")));
  // Cancelling again keeps the final state.
  cancel = c.Psctl({"cancel", "job-1"});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.output;
  EXPECT_THAT(cancel.output, HasSubstr("job-1 cancelled"));

  metrics = c.SchedulerMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("pscluster_scheduler_jobs{state=\"cancelled\"} 1"));
  EXPECT_THAT(*metrics, Not(HasSubstr("pscluster_job_step{")));

  // A new job runs to the end on the same workers.
  CommandResult next = c.Psctl(
      {"submit", c.WriteFile("next.yaml", FashionJobYaml("next", 1, "")), "--wait"},
      absl::Seconds(80));
  ASSERT_EQ(next.exit_code, 0) << next.output << c.LogTails();
  EXPECT_THAT(next.output, HasSubstr("job-2 succeeded"));
  auto job2 = c.JobViaPsctl("job-2");
  ASSERT_TRUE(job2.ok()) << job2.status();
  EXPECT_EQ(job2->state(), v1::JOB_SUCCEEDED);
  EXPECT_GE(job2->progress().test_accuracy(), 0.80);
  EXPECT_THAT(job2->workers(), ElementsAre("worker-1", "worker-2"));
  EXPECT_EQ(job2->progress().step(), 300);
}

}  // namespace
}  // namespace pscluster::testing
