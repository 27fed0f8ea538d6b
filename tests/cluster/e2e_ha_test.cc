// End to end with the real daemons and a real three-member etcd cluster on loopback: two
// ps_scheduler processes share the state in etcd (--etcd_endpoints) and elect one leader; the
// servers, workers and psctl are given both addresses. The leading scheduler is killed with
// SIGKILL while a job trains: the other takes over within a few seconds (measured and printed),
// the job carries on and succeeds with no rollback, no task handed out twice. Then an etcd member
// is lost (survived), and the whole etcd cluster stops answering: the leader steps down before
// its lease can expire, and a leader is back, with the state intact, once etcd answers again.
#include <signal.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/atomic_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/etcd_client.h"
#include "scheduler/psctl/client.h"
#include "scheduler/testing/etcd_cluster.h"
#include "tests/cluster/e2e_cluster.h"

namespace pscluster::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

std::string Log(const StartedDaemon& d) { return ReadFile(d.log).value_or(""); }

std::string Tails(const std::vector<const StartedDaemon*>& daemons) {
  std::string out;
  for (const StartedDaemon* d : daemons) {
    std::string log = Log(*d);
    const size_t from = log.size() > 3000 ? log.size() - 3000 : 0;
    absl::StrAppend(&out, "\n---- ", d->log, "\n", log.substr(from));
  }
  return out;
}

TEST(E2eHaTest, TheLeadingSchedulerKilledMidJobAnotherTakesOverAndTheJobSucceedsWithNoRollback) {
  const std::string dir = TestDir("ha");
  auto etcd = scheduler::testing::EtcdCluster::Start(dir, 3);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::vector<std::string> common = {
      absl::StrCat("--etcd_endpoints=", (*etcd)->endpoints()), "--etcd_lease_seconds=6",
      "--lease_ms=4000", "--startup_grace_ms=200", "--rebalance_every_ms=0"};
  auto s1 = StartDaemonIn(dir, SchedulerBinary(), "scheduler-1", common);
  ASSERT_TRUE(s1.ok()) << s1.status();
  auto s2 = StartDaemonIn(dir, SchedulerBinary(), "scheduler-2", common);
  ASSERT_TRUE(s2.ok()) << s2.status();
  const std::string both = absl::StrCat(s1->address, ",", s2->address);

  psctl::ClientOptions co;
  co.address = both;
  co.timeout = absl::Seconds(5);
  auto client = psctl::SchedulerClient::Connect(co);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(WaitFor(absl::Seconds(20), [&] { return (*client)->ClusterStatus("").ok(); }))
      << Tails({&*s1, &*s2});

  // One leads; the other answers UNAVAILABLE naming it. (A call that changes state, on a job
  // that does not exist: the leader says NOT_FOUND; reads like ClusterStatus a follower answers
  // too.)
  auto status_at = [&](const std::string& address) {
    psctl::ClientOptions one = co;
    one.address = address;
    auto c = psctl::SchedulerClient::Connect(one);
    return c.ok() ? (*c)->CancelJob("job-none", "which scheduler leads?").status() : c.status();
  };
  const bool first_leads = status_at(s1->address).code() == absl::StatusCode::kNotFound;
  StartedDaemon& leader = first_leads ? *s1 : *s2;
  StartedDaemon& follower = first_leads ? *s2 : *s1;
  // (Once it has looked the leader up: until then it says no leader is known yet.)
  absl::Status refused;
  EXPECT_TRUE(WaitFor(absl::Seconds(10), [&] {
    refused = status_at(follower.address);
    return absl::StrContains(refused.message(), absl::StrCat("the leader is at ", leader.address));
  })) << refused;
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;

  std::vector<StartedDaemon> nodes;
  for (const char* name : {"server-1", "server-2"}) {
    auto d = StartDaemonIn(dir, ServerBinary(), name,
                           {absl::StrCat("--scheduler=", both),
                            absl::StrCat("--checkpoint_dir=", dir, "/", name, "-checkpoints")});
    ASSERT_TRUE(d.ok()) << d.status();
    nodes.push_back(std::move(*d));
  }
  for (const char* name : {"worker-1", "worker-2"}) {
    auto d = StartDaemonIn(dir, WorkerBinary(), name,
                           {absl::StrCat("--scheduler=", both), "--device=cpu", "--cpu_threads=1"});
    ASSERT_TRUE(d.ok()) << d.status();
    nodes.push_back(std::move(*d));
  }
  std::vector<const StartedDaemon*> all = {&*s1, &*s2};
  for (const StartedDaemon& n : nodes) all.push_back(&n);
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    auto st = (*client)->ClusterStatus("");
    return st.ok() && st->nodes_size() == 4;
  })) << Tails(all);

  // A job long enough to outlive the takeover, submitted with psctl through both addresses.
  const std::string yaml = absl::StrCat(dir, "/long.yaml");
  ASSERT_TRUE(WriteFileAtomically(yaml, FashionJobYaml("long", 100, "")).ok());
  CommandResult submitted = RunCommand(PsctlBinary(), {absl::StrCat("--scheduler=", both),
                                                       "submit", yaml});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  ASSERT_EQ(absl::StripAsciiWhitespace(submitted.output), "job-1");
  v1::Job seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto j = (*client)->GetJob("job-1");
    if (j.ok()) seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= 40;
  })) << seen.DebugString() << Tails(all);
  const int64_t step_at_kill = seen.progress().step();
  // Its shard map's epoch is an etcd revision: that of the fenced write that took it (a counter
  // would say 1).
  {
    auto etcd_client = scheduler::EtcdClient::Connect((*etcd)->endpoints(), absl::Seconds(5));
    ASSERT_TRUE(etcd_client.ok()) << etcd_client.status();
    auto kv = (*etcd_client)->Get("/pscluster/epochs/job-1");
    ASSERT_TRUE(kv.ok()) << kv.status();
    EXPECT_EQ(seen.shard_map_epoch(), static_cast<uint64_t>(kv->mod_revision()));
    EXPECT_GT(seen.shard_map_epoch(), 1u);
  }
  // The follower answers reads from etcd (psctl given its address alone).
  CommandResult from_follower =
      RunCommand(PsctlBinary(), {absl::StrCat("--scheduler=", follower.address), "jobs"});
  EXPECT_EQ(from_follower.exit_code, 0) << from_follower.output;
  EXPECT_THAT(from_follower.output, HasSubstr("job-1"));

  ASSERT_EQ(kill(leader.process->pid(), SIGKILL), 0);
  const absl::Time killed = absl::Now();
  // The other scheduler takes over: calls through the list are answered again.
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] { return (*client)->GetJob("job-1").ok(); }))
      << Tails(all);
  const absl::Duration takeover = absl::Now() - killed;
  std::printf("takeover after kill -9 of the leading scheduler: %s (leadership lease 6 s)\n",
              absl::FormatDuration(takeover).c_str());
  EXPECT_LE(takeover, absl::Seconds(14)) << Tails(all);
  EXPECT_THAT(Log(follower), HasSubstr("leading (term"));
  // The servers heard from the new leader, whose term is higher: the old one's calls would now
  // be refused (common/scheduler_term.h).
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(WaitFor(absl::Seconds(20), [&] {
      return absl::StrContains(Log(nodes[i]), "a new scheduler leads: term");
    })) << nodes[i].log << "\n" << Log(nodes[i]);
  }

  // The job carries on under the new leader, with reports from both ranks.
  const int64_t took_over_ms = absl::ToUnixMillis(absl::Now());
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    auto j = (*client)->GetJob("job-1");
    if (!j.ok()) return false;
    seen = *j;
    if (j->state() != v1::JOB_RUNNING || j->progress().step() <= step_at_kill) return false;
    for (const v1::WorkerProgress& w : j->progress().workers()) {
      if (w.updated_unix_ms() < took_over_ms) return false;
    }
    return true;
  })) << seen.DebugString() << Tails(all);

  // An etcd member lost meanwhile is survived, without the leadership changing hands.
  (*etcd)->Kill(0);

  v1::Job done;
  ASSERT_TRUE(WaitFor(absl::Seconds(240), [&] {
    auto j = (*client)->GetJob("job-1");
    if (j.ok()) done = *j;
    return j.ok() && (j->state() == v1::JOB_SUCCEEDED || j->state() == v1::JOB_FAILED ||
                      j->state() == v1::JOB_CANCELLED);
  })) << done.DebugString() << Tails(all);
  EXPECT_EQ(done.state(), v1::JOB_SUCCEEDED) << done.reason() << Tails(all);
  EXPECT_EQ(done.recovery().recoveries(), 0u) << done.recovery().DebugString();
  EXPECT_GE(done.progress().test_accuracy(), 0.80);
  EXPECT_THAT(done.progress().waiting_for(), IsEmpty());
  EXPECT_THAT(Log(follower), HasSubstr("restored 1 jobs (1 active)"));
  EXPECT_EQ(Count(Log(follower), "job job-1 placed"), 0) << "the new leader placed job-1 again";
  for (size_t i = 2; i < 4; ++i) {
    EXPECT_EQ(Count(Log(nodes[i]), "task: job job-1 "), 1) << nodes[i].log << "\n" << Log(nodes[i]);
  }

  EXPECT_EQ(Count(Log(follower), "lost the leadership"), 0) << Tails(all);

  // etcd stops answering altogether: the leader steps down before its lease can expire.
  for (int i = 1; i < (*etcd)->size(); ++i) (*etcd)->Pause(i);
  ASSERT_TRUE(WaitFor(absl::Seconds(10), [&] {
    return Log(follower).find("before the lease can expire at the earliest") != std::string::npos;
  })) << Tails(all);
  {
    const std::string log = Log(follower);
    const size_t at = log.rfind("lost the leadership");
    const size_t end = log.find('\n', log.find("before the lease can expire", at));
    const std::string lines = log.substr(at, end - at);
    std::printf("%s\n", lines.c_str());
    // "scheduler stopped (term N), 980ms before the lease ...": a margin, not a negative one.
    const size_t margin = lines.find("), ", lines.find("scheduler stopped (term"));
    ASSERT_NE(margin, std::string::npos) << lines;
    EXPECT_NE(lines[margin + 3], '-') << lines;
  }
  EXPECT_EQ((*client)->GetJob("job-1").status().code(), absl::StatusCode::kUnavailable);
  for (int i = 1; i < (*etcd)->size(); ++i) (*etcd)->Resume(i);
  // Back once etcd answers, with the state intact.
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    auto j = (*client)->GetJob("job-1");
    return j.ok() && j->state() == v1::JOB_SUCCEEDED;
  })) << Tails(all);
  CommandResult jobs = RunCommand(PsctlBinary(), {absl::StrCat("--scheduler=", both), "jobs"});
  EXPECT_EQ(jobs.exit_code, 0) << jobs.output;
  EXPECT_EQ(Count(jobs.output, "job-"), 1) << jobs.output;
}

}  // namespace
}  // namespace pscluster::testing
