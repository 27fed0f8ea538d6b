// End to end with the real daemons: network partitions between a daemon and the scheduler, made
// with a TCP proxy that the test cuts.
//
// A worker cut off from the scheduler still reaches the servers and keeps training, but its
// heartbeats no longer arrive: once its lease lapses the scheduler hands its rank to a spare
// worker. The servers fence the rank at the new task's attempt first, so the cut-off worker's
// next call is refused and its task stops by itself: two tasks never train the same rank. When
// the partition heals, the worker joins the cluster again.
//
// A server cut off from the scheduler still serves the workers, but once its lease lapses the
// job is stopped, rolled back to its newest complete checkpoint and placed again on a spare
// server. When the partition heals, the server drops its stale copy of the job.
//
// Both jobs succeed with every update applied exactly once.

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/e2e_cluster.h"
#include "tests/cluster/exactly_once.h"
#include "tests/cluster/tcp_proxy.h"

namespace pscluster::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

// 300 steps per epoch and worker; a wider hidden layer than the other tests' so that the job
// outlasts the lease by far (the cut-off worker trains on at full speed until it is fenced).
constexpr int kEpochs = 14;
constexpr int kHidden = 256;
constexpr int kCheckpointEvery = 150;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Waits until the scheduler lists `n` live nodes of `role`.
bool WaitForLive(const E2eCluster& c, v1::NodeRole role, int n) {
  return WaitFor(absl::Seconds(30), [&] {
    auto nodes = c.ClusterStatus();
    if (!nodes.ok()) return false;
    int alive = 0;
    for (const auto& node : nodes->nodes()) {
      alive += node.info().role() == role && node.state() == v1::NODE_ALIVE;
    }
    return alive == n;
  });
}

// Submits the Fashion-MNIST job with periodic checkpoints under `ckpt` and waits until it runs
// past `step`; `seen` gets its last state. Returns the job's id ("" on failure, reported).
std::string SubmitAndRunPast(E2eCluster& c, const std::string& ckpt, int64_t step,
                             v1::Job* seen) {
  std::string yaml = absl::StrCat(FashionJobYaml("partitioned", kEpochs, "", kHidden),
                                  "checkpoint_every_steps: ", kCheckpointEvery, "\n",
                                  "checkpoint_dir: ", ckpt, "\n");
  CommandResult submit = c.Psctl({"submit", c.WriteFile("job.yaml", yaml)});
  if (submit.exit_code != 0) {
    ADD_FAILURE() << submit.output;
    return "";
  }
  const std::string id = "job-1";
  const bool running = WaitFor(absl::Seconds(120), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) *seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= step;
  });
  if (!running) {
    ADD_FAILURE() << seen->DebugString() << c.LogTails();
    return "";
  }
  return id;
}

std::optional<v1::NodeState> StateOf(const E2eCluster& c, const std::string& node) {
  auto nodes = c.ClusterStatus();
  if (!nodes.ok()) return std::nullopt;
  for (const v1::NodeStatus& n : nodes->nodes()) {
    if (n.info().node_id() == node) return n.state();
  }
  return std::nullopt;
}

TEST(E2ePartitionTest, AWorkerCutOffFromTheSchedulerIsFencedOffAndItsRankCarriesOn) {
  E2eClusterOptions o;
  o.workers = 1;
  auto cluster = E2eCluster::Start("partition", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  // The second worker reaches the scheduler only through the proxy; everything else (the
  // scheduler's calls to it, its data plane to the servers) goes direct.
  auto proxy = TcpProxy::Start(c.scheduler_address());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  auto cutoff = c.StartWorker("cutoff", (*proxy)->address());
  ASSERT_TRUE(cutoff.ok()) << cutoff.status();
  ASSERT_TRUE(WaitForLive(c, v1::ROLE_WORKER, 2)) << cutoff->process->Output() << c.LogTails();
  auto cutoff_status = E2eCluster::WorkerStatusAt(cutoff->address);
  ASSERT_TRUE(cutoff_status.ok()) << cutoff_status.status();
  const std::string cutoff_id = cutoff_status->node_id();

  const std::string ckpt = c.dir() + "/ckpt";
  v1::Job seen;
  const std::string id = SubmitAndRunPast(c, ckpt, 150, &seen);
  ASSERT_FALSE(id.empty());
  ASSERT_THAT(seen.workers(), SizeIs(2));
  const int rank = seen.workers(0) == cutoff_id ? 0 : 1;
  ASSERT_EQ(seen.workers(rank), cutoff_id);

  // A spare worker for the rank, then the partition.
  auto spare = c.StartWorker("spare", c.scheduler_address());
  ASSERT_TRUE(spare.ok()) << spare.status();
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    auto ws = E2eCluster::WorkerStatusAt(spare->address);
    return ws.ok() && !ws->node_id().empty() &&
           StateOf(c, ws->node_id()) == v1::NODE_ALIVE;
  })) << spare->process->Output();
  (*proxy)->Cut();

  ASSERT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->recovery().handovers() == 1;
  })) << seen.DebugString() << c.LogTails();
  EXPECT_NE(seen.workers(rank), cutoff_id);
  EXPECT_THAT(seen.recovery().last_cause(),
              HasSubstr(absl::StrCat("worker of rank ", rank, " ", cutoff_id)));
  EXPECT_THAT(seen.recovery().last_cause(), HasSubstr("stopped heartbeating"));
  // The cut-off worker never heard of that (it cannot reach the scheduler), yet its task stops:
  // the servers refuse the replaced attempt's next call.
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    auto ws = E2eCluster::WorkerStatusAt(cutoff->address);
    return ws.ok() && !ws->busy();
  })) << cutoff->process->Output();
  const std::string log = ReadAll(cutoff->log);
  EXPECT_THAT(log, HasSubstr(absl::StrCat("rank ", rank, " of job '", id,
                                          "' was handed to a newer task (attempt 1); this "
                                          "task (attempt 0) was replaced and must stop")));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("task stopped: job ", id, " rank ", rank)));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("task failed")));

  // The partition heals: the worker is a member of the cluster again.
  (*proxy)->Heal();
  auto done = c.WaitForEnd(id, absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().handovers(), 1u);
  EXPECT_EQ(done->recovery().recoveries(), 0u);
  EXPECT_EQ(done->progress().step(), kEpochs * 300);
  EXPECT_GE(done->progress().test_accuracy(), 0.83);
  // Every block was updated once per worker and step: nothing the cut-off task pushed was
  // applied twice, nothing skipped.
  ExpectEveryUpdateAppliedOnce(ckpt + "/" + id, *done);
  EXPECT_TRUE(WaitFor(absl::Seconds(90), [&] {
    return StateOf(c, cutoff_id) == v1::NODE_ALIVE;
  })) << cutoff->process->Output();
  if (HasFailure()) ADD_FAILURE() << c.LogTails(200) << "\ncut-off worker:\n" << log;
}

TEST(E2ePartitionTest, AServerCutOffFromTheSchedulerIsReplacedAndDropsItsStaleCopy) {
  E2eClusterOptions o;
  o.servers = 1;
  auto cluster = E2eCluster::Start("server_partition", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  auto proxy = TcpProxy::Start(c.scheduler_address());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  auto cutoff = c.StartServer("cutoff", (*proxy)->address());
  ASSERT_TRUE(cutoff.ok()) << cutoff.status();
  ASSERT_TRUE(WaitForLive(c, v1::ROLE_SERVER, 2)) << cutoff->process->Output() << c.LogTails();
  auto cutoff_status = E2eCluster::ServerStatusAt(cutoff->address);
  ASSERT_TRUE(cutoff_status.ok()) << cutoff_status.status();
  const std::string cutoff_id = cutoff_status->node_id();

  const std::string ckpt = c.dir() + "/ckpt";
  v1::Job seen;
  const std::string id = SubmitAndRunPast(c, ckpt, 2 * kCheckpointEvery + 50, &seen);
  ASSERT_FALSE(id.empty());
  ASSERT_THAT(seen.servers(), Contains(cutoff_id));

  auto spare = c.StartServer("spare", c.scheduler_address());
  ASSERT_TRUE(spare.ok()) << spare.status();
  ASSERT_TRUE(WaitForLive(c, v1::ROLE_SERVER, 3)) << spare->process->Output();
  (*proxy)->Cut();

  // Rolled back to a checkpointed step and running again without the cut-off server.
  ASSERT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->recovery().recoveries() == 1 && j->state() == v1::JOB_RUNNING;
  })) << seen.DebugString() << c.LogTails();
  EXPECT_THAT(seen.servers(), Not(Contains(cutoff_id)));
  EXPECT_THAT(seen.recovery().last_cause(),
              HasSubstr(absl::StrCat("server holding shards ", cutoff_id)));
  EXPECT_THAT(seen.recovery().last_cause(), HasSubstr("stopped heartbeating"));
  EXPECT_GE(seen.recovery().start_step(), kCheckpointEvery);
  EXPECT_EQ(seen.recovery().start_step() % kCheckpointEvery, 0);

  // The partition heals: the server registers again and forgets the job that moved away.
  (*proxy)->Heal();
  EXPECT_TRUE(WaitFor(absl::Seconds(90), [&] {
    auto st = E2eCluster::ServerStatusAt(cutoff->address);
    return st.ok() && st->jobs_size() == 0 && StateOf(c, cutoff_id) == v1::NODE_ALIVE;
  })) << cutoff->process->Output();
  auto done = c.WaitForEnd(id, absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().recoveries(), 1u);
  EXPECT_EQ(done->progress().step(), kEpochs * 300);
  EXPECT_GE(done->progress().test_accuracy(), 0.83);
  ExpectEveryUpdateAppliedOnce(ckpt + "/" + id, *done);
  if (HasFailure()) ADD_FAILURE() << c.LogTails(200) << "\ncut-off server:\n" << ReadAll(cutoff->log);
}

}  // namespace
}  // namespace pscluster::testing
