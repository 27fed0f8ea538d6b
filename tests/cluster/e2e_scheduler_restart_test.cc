// End to end with the real daemons: ps_scheduler killed with SIGKILL in the middle of a job and
// restarted on the same database and address. The workers keep training while it is down; once
// it is back the daemons carry on under the same node ids, progress reports resume, the running
// job reaches SUCCEEDED and the job queued behind it runs next — no job lost or duplicated, no
// task handed out twice.
#include <signal.h>

#include <algorithm>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/atomic_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/e2e_cluster.h"

namespace pscluster::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

std::vector<std::string> NodeIds(const v1::ClusterStatusResponse& st) {
  std::vector<std::string> ids;
  for (const v1::NodeStatus& n : st.nodes()) ids.push_back(n.info().node_id());
  std::sort(ids.begin(), ids.end());
  return ids;
}

TEST(E2eSchedulerRestartTest, KillNineMidJobThenRestartTheJobCarriesOnToSucceeded) {
  auto cluster = E2eCluster::Start("restart");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  auto before = c.ClusterStatus();
  ASSERT_TRUE(before.ok()) << before.status();
  const std::vector<std::string> ids = NodeIds(*before);
  ASSERT_THAT(ids, ElementsAre("server-1", "server-2", "worker-1", "worker-2"));

  // job-1 trains for 100 epochs (20-75 s here: longer than the outage below even on an idle
  // machine), followed by `psctl submit --wait` across the
  // restart; job-2 waits in the queue for its workers.
  auto follow = c.StartPsctl({"submit", c.WriteFile("long.yaml", FashionJobYaml("long", 100, "")),
                              "--wait", "--timeout=2s"});
  ASSERT_TRUE(follow.ok()) << follow.status();
  ASSERT_TRUE(WaitFor(absl::Seconds(20), [&] { return c.GetJob("job-1").ok(); }))
      << (*follow)->Output();
  CommandResult second =
      c.Psctl({"submit", c.WriteFile("next.yaml", FashionJobYaml("next", 1, ""))});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_EQ(absl::StripAsciiWhitespace(second.output), "job-2");

  v1::Job seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    auto j = c.GetJob("job-1");
    if (j.ok()) seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= 40;
  })) << seen.DebugString() << c.LogTails();
  EXPECT_EQ(c.GetJob("job-2")->state(), v1::JOB_QUEUED);
  const int64_t step_at_kill = seen.progress().step();

  ASSERT_TRUE(c.processes().Signal("scheduler", SIGKILL).ok());
  // The workers train on without it (their pulls and pushes go to the servers).
  auto w1 = c.WorkerStatus("worker-1");
  ASSERT_TRUE(w1.ok()) << w1.status();
  EXPECT_TRUE(w1->busy());
  EXPECT_EQ(w1->job_id(), "job-1");
  absl::SleepFor(absl::Seconds(2));
  auto w1_later = c.WorkerStatus("worker-1");
  ASSERT_TRUE(w1_later.ok()) << w1_later.status();
  EXPECT_GT(w1_later->step(), w1->step()) << "worker-1 stopped training without the scheduler";
  EXPECT_EQ(c.GetJob("job-1").status().code(), absl::StatusCode::kUnavailable);

  const int64_t restart_ms = absl::ToUnixMillis(absl::Now());
  std::ostringstream progress;
  absl::Status restarted = c.processes().Restart("scheduler", progress);
  ASSERT_TRUE(restarted.ok()) << restarted << "\n" << progress.str() << c.LogTails();

  // Progress reports resume: job-1, still running, moves past where the old scheduler saw it,
  // with reports from both ranks received by the new one.
  ASSERT_TRUE(WaitFor(absl::Seconds(20), [&] {
    auto j = c.GetJob("job-1");
    if (!j.ok()) return false;
    seen = *j;
    if (j->state() != v1::JOB_RUNNING || j->progress().step() <= step_at_kill) return false;
    for (const v1::WorkerProgress& w : j->progress().workers()) {
      if (w.updated_unix_ms() < restart_ms) return false;
    }
    return true;
  })) << seen.DebugString() << c.LogTails();

  // The daemons are known again under their old ids, all alive, and no new node appeared.
  ASSERT_TRUE(WaitFor(absl::Seconds(15), [&] {
    auto st = c.ClusterStatus();
    if (!st.ok()) return false;
    for (const v1::NodeStatus& n : st->nodes()) {
      if (n.state() != v1::NODE_ALIVE) return false;
    }
    return NodeIds(*st) == ids;
  })) << c.ClusterStatus()->DebugString();

  auto done = c.WaitForEnd("job-1", absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  // psctl followed job-1 through the outage to the end.
  EXPECT_EQ((*follow)->Wait(absl::Seconds(10)), 0) << (*follow)->Output();
  EXPECT_EQ(Count((*follow)->Output(), "scheduler unreachable, retrying for up to 1m: cannot "
                                       "reach the scheduler at " + c.scheduler_address()),
            1)
      << (*follow)->Output();
  EXPECT_THAT((*follow)->Output(), HasSubstr("scheduler reachable again after "));
  EXPECT_THAT((*follow)->Output(), HasSubstr("job-1 succeeded"));
  EXPECT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_GE(done->progress().test_accuracy(), 0.80);
  EXPECT_THAT(done->progress().waiting_for(), IsEmpty());
  EXPECT_THAT(done->workers(), ElementsAre("worker-1", "worker-2"));
  auto next = c.WaitForEnd("job-2", absl::Seconds(60));
  ASSERT_TRUE(next.ok()) << next.status() << c.LogTails();
  EXPECT_EQ(next->state(), v1::JOB_SUCCEEDED) << next->reason() << c.LogTails();

  // Exactly the two jobs, as psctl sees them.
  CommandResult jobs = c.Psctl({"jobs"});
  ASSERT_EQ(jobs.exit_code, 0) << jobs.output;
  EXPECT_EQ(Count(jobs.output, "job-"), 2) << jobs.output;
  auto st = c.ClusterStatus();
  ASSERT_TRUE(st.ok());
  ASSERT_THAT(st->jobs(), SizeIs(2));
  EXPECT_EQ(st->jobs(0).job_id(), "job-2");
  EXPECT_EQ(st->jobs(1).job_id(), "job-1");
  EXPECT_THAT(NodeIds(*st), ElementsAreArray(ids));

  // Each worker got each task once: the restart handed nothing out again.
  for (const char* w : {"worker-1", "worker-2"}) {
    std::string log = ReadFile(c.processes().LogFile(w)).value_or("");
    EXPECT_EQ(Count(log, "task: job job-1 "), 1) << w << "\n" << log;
    EXPECT_EQ(Count(log, "task: job job-2 "), 1) << w << "\n" << log;
  }
  std::string sched_log = ReadFile(c.processes().LogFile("scheduler")).value_or("");
  EXPECT_THAT(sched_log, HasSubstr("restored 2 jobs (2 active)"));
  EXPECT_EQ(Count(sched_log, "job job-1 placed"), 1) << sched_log;
}

TEST(E2eSchedulerRestartTest, AJobThatEndsWhileTheSchedulerIsDownSucceedsWhenItIsBack) {
  auto cluster = E2eCluster::Start("ends_while_down");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string model = c.dir() + "/while-down.safetensors";
  CommandResult submit =
      c.Psctl({"submit", c.WriteFile("job.yaml", FashionJobYaml("while-down", 1, model))});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    auto j = c.GetJob("job-1");
    return j.ok() && j->state() == v1::JOB_RUNNING;
  })) << c.LogTails();
  ASSERT_TRUE(c.processes().Signal("scheduler", SIGKILL).ok());

  // Both workers finish every step and hold on to their final report (they retry it).
  for (const char* w : {"worker-1", "worker-2"}) {
    absl::StatusOr<v1::WorkerStatus> s;
    ASSERT_TRUE(WaitFor(absl::Seconds(40), [&] {
      s = c.WorkerStatus(w);
      return s.ok() && s->busy() && s->step() == 300;
    })) << w << ": " << (s.ok() ? s->DebugString() : s.status().ToString()) << c.LogTails();
  }
  absl::SleepFor(absl::Seconds(1));

  std::ostringstream progress;
  absl::Status restarted = c.processes().Restart("scheduler", progress);
  ASSERT_TRUE(restarted.ok()) << restarted << "\n" << progress.str() << c.LogTails();
  auto done = c.WaitForEnd("job-1", absl::Seconds(30));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  EXPECT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason();
  EXPECT_GE(done->progress().test_accuracy(), 0.80);
  EXPECT_EQ(done->export_path(), model);
  EXPECT_TRUE(ReadFile(model).ok()) << model;
  EXPECT_THAT(done->progress().waiting_for(), IsEmpty());
  for (const char* w : {"worker-1", "worker-2"}) {
    EXPECT_TRUE(WaitFor(absl::Seconds(10), [&] {
      auto s = c.WorkerStatus(w);
      return s.ok() && !s->busy();
    })) << w;
  }
}

}  // namespace
}  // namespace pscluster::testing
