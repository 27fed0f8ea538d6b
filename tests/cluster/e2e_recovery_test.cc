// End to end with the real daemons: machines die under a running job and it keeps going. A
// Fashion-MNIST job with periodic checkpoints runs on 2 of 3 servers and 2 of 3 workers. One of
// its servers is killed with SIGKILL: once its lease lapses the scheduler stops the job, rolls it
// back to the newest step that every server checkpointed, and places it again on the spare
// server, which loads the dead server's shards from its checkpoint. Then one of its workers is
// killed: its rank goes to the spare worker, which resumes it where it stood on the servers, with
// no rollback. The job succeeds with the accuracy of an undisturbed run, every update applied
// exactly once, and status says what happened.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/checkpoint_file.h"
#include "tests/cluster/e2e_cluster.h"
#include "tests/cluster/exactly_once.h"

namespace pscluster::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

constexpr int kEpochs = 12;             // 300 steps per epoch and worker.
constexpr int kCheckpointEvery = 150;

// The server of `servers` whose checkpoints in `dir` are largest: the one holding most of the
// model (a small model's few blocks may all hash to one server).
// A Fashion-MNIST job over `servers` servers keeping `replication` copies of every shard,
// checkpointed every kCheckpointEvery steps into `ckpt`.
std::string ReplicatedJobYaml(const std::string& name, int epochs, int servers, int replication,
                              const std::string& ckpt) {
  return absl::StrCat(
      absl::StrReplaceAll(FashionJobYaml(name, epochs, "", 256),
                          {{"num_servers: 2", absl::StrCat("num_servers: ", servers)}}),
      "replication: ", replication, "\n", "checkpoint_every_steps: ", kCheckpointEvery, "\n",
      "checkpoint_dir: ", ckpt, "\n");
}

// Submits ReplicatedJobYaml(name, ...) to `c` with its checkpoints under `ckpt`; false (and a
// test failure with psctl's output) when the submission is refused.
bool SubmitReplicatedJob(E2eCluster& c, const std::string& name, int epochs, int servers,
                         int replication, const std::string& ckpt) {
  const std::string yaml = ReplicatedJobYaml(name, epochs, servers, replication, ckpt);
  CommandResult submit = c.Psctl({"submit", c.WriteFile("job.yaml", yaml)});
  if (submit.exit_code != 0) ADD_FAILURE() << submit.output;
  return submit.exit_code == 0;
}

// Waits for job `id` to end and checks it succeeded by `promotions` promotions and no rollback:
// every step of its `epochs`, a trained model, every update applied once (its checkpoints under
// `ckpt`). Returns the job as it ended (nullopt: it did not end, or failed; reported).
std::optional<v1::Job> ExpectPromotedWithoutRollback(E2eCluster& c, const std::string& id,
                                                     const std::string& ckpt,
                                                     uint32_t promotions, int epochs) {
  auto done = c.WaitForEnd(id, absl::Seconds(240));
  if (!done.ok()) {
    ADD_FAILURE() << done.status() << c.LogTails();
    return std::nullopt;
  }
  if (done->state() != v1::JOB_SUCCEEDED) {
    ADD_FAILURE() << done->reason() << c.LogTails();
    return std::nullopt;
  }
  EXPECT_EQ(done->recovery().promotions(), promotions);
  EXPECT_EQ(done->recovery().recoveries(), 0u) << "no rollback";
  EXPECT_EQ(done->progress().rolled_back_to_step(), -1);
  EXPECT_EQ(done->progress().step(), epochs * 300);
  EXPECT_GE(done->progress().test_accuracy(), 0.83);
  // The survivors' last checkpoints hold every shard, each block updated once per worker and
  // step: nothing lost with a dead primary, nothing applied twice when the ranks resumed.
  ExpectEveryUpdateAppliedOnce(ckpt + "/" + id, *done);
  return *done;
}

std::string BusiestServer(const std::string& dir, const google::protobuf::RepeatedPtrField<std::string>& servers) {
  std::string best = servers.empty() ? "" : servers[0];
  off_t best_size = -1;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return best;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    for (const std::string& s : servers) {
      if (name.rfind(s + "-step", 0) != 0) continue;
      struct stat st;
      if (stat((dir + "/" + name).c_str(), &st) == 0 && st.st_size > best_size) {
        best_size = st.st_size;
        best = s;
      }
    }
  }
  closedir(d);
  return best;
}

// The newest step of `server`'s checkpoint files in `dir` (-1: none).
int64_t NewestCheckpointStep(const std::string& dir, const std::string& server) {
  int64_t newest = -1;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return newest;
  const std::string head = server + "-step";
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(head, 0) != 0 || name.size() <= head.size() + 5 ||
        name.compare(name.size() - 5, 5, ".ckpt") != 0) {
      continue;
    }
    newest = std::max<int64_t>(newest, std::strtoll(name.c_str() + head.size(), nullptr, 10));
  }
  closedir(d);
  return newest;
}

TEST(E2eRecoveryTest, KilledServerThenKilledWorkerTheJobRollsBackAndSucceeds) {
  E2eClusterOptions o;
  o.servers = 3;
  o.workers = 3;
  auto cluster = E2eCluster::Start("recovery", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string ckpt = c.dir() + "/ckpt";
  std::string yaml = absl::StrCat(FashionJobYaml("survivor", kEpochs, c.dir() + "/model.safetensors"),
                                  "checkpoint_every_steps: ", kCheckpointEvery, "\n",
                                  "checkpoint_dir: ", ckpt, "\n");
  CommandResult submit = c.Psctl({"submit", c.WriteFile("job.yaml", yaml)});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  const std::string id = "job-1";

  // Run until both servers have checkpointed at least twice, then kill one of them.
  v1::Job seen;
  auto running_past = [&](int64_t step) {
    return [&, step] {
      auto j = c.GetJob(id);
      if (j.ok()) seen = *j;
      return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= step;
    };
  };
  ASSERT_TRUE(WaitFor(absl::Seconds(120), running_past(2 * kCheckpointEvery + 50)))
      << seen.DebugString() << c.LogTails();
  ASSERT_THAT(seen.servers(), SizeIs(2));
  const std::string dead_server = BusiestServer(ckpt + "/" + id, seen.servers());
  const double loss_at_kill = seen.progress().loss();
  ASSERT_TRUE(c.processes().Signal(dead_server, SIGKILL).ok()) << dead_server;

  // Recovered: running again, on the spare server, from a checkpointed step.
  ASSERT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->recovery().recoveries() == 1 && j->state() == v1::JOB_RUNNING;
  })) << seen.DebugString() << c.LogTails();
  EXPECT_THAT(seen.servers(), Not(Contains(dead_server)));
  EXPECT_THAT(seen.recovery().last_cause(),
              HasSubstr(absl::StrCat("server holding shards ", dead_server)));
  EXPECT_THAT(seen.recovery().last_cause(), HasSubstr("stopped heartbeating"));
  const int64_t first_rollback = seen.recovery().start_step();
  EXPECT_GE(first_rollback, 2 * kCheckpointEvery);
  // No later than the dead server's newest checkpoint (it can write none now). Not bounded by
  // the step seen before the kill: progress reports lag the servers, which may have
  // checkpointed past it.
  EXPECT_LE(first_rollback, NewestCheckpointStep(ckpt + "/" + id, dead_server));
  EXPECT_EQ(first_rollback % kCheckpointEvery, 0);
  // Every server of the new placement restored its shards from the files of that step.
  EXPECT_THAT(seen.recovery().restore_from(), SizeIs(2));
  for (const v1::RestoreFile& f : seen.recovery().restore_from()) {
    EXPECT_THAT(f.path(), HasSubstr(absl::StrCat("-step", first_rollback, ".ckpt")));
  }
  // The restored weights are the trained ones: the loss carries on where it was, far below a
  // fresh model's (2.3 at the start, still near 1 after a hundred steps).
  ASSERT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto j = c.GetJob(id);
    if (!j.ok() || j->recovery().recoveries() != 1) return false;
    seen = *j;
    for (const v1::WorkerProgress& w : j->progress().workers()) {
      if (w.step() < first_rollback + 100) return false;
    }
    return true;
  })) << seen.DebugString() << c.LogTails();
  EXPECT_LT(seen.progress().loss(), std::max(0.6, 1.3 * loss_at_kill))
      << "before the kill: " << loss_at_kill;
  CommandResult status = c.Psctl({"status", id});
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr(absl::StrCat("Rolled back:  to step ", first_rollback)));
  EXPECT_THAT(status.output, HasSubstr("Recoveries:   1 rollback(s), 0 hand-over(s), the last"));

  // Then a worker of the job dies; its rank moves to the spare worker.
  ASSERT_TRUE(WaitFor(absl::Seconds(120), running_past(first_rollback + 2 * kCheckpointEvery)))
      << seen.DebugString() << c.LogTails();
  ASSERT_THAT(seen.workers(), SizeIs(2));
  const std::string dead_worker = seen.workers(0);
  ASSERT_TRUE(c.processes().Signal(dead_worker, SIGKILL).ok()) << dead_worker;

  auto done = c.WaitForEnd(id, absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().recoveries(), 1u);
  EXPECT_EQ(done->recovery().handovers(), 1u);
  EXPECT_THAT(done->recovery().last_cause(),
              HasSubstr(absl::StrCat("worker of rank 0 ", dead_worker)));
  EXPECT_THAT(done->workers(), Not(Contains(dead_worker)));
  EXPECT_THAT(done->servers(), Not(Contains(dead_server)));
  // No second rollback: the servers kept their state through the worker's loss.
  EXPECT_EQ(done->recovery().start_step(), first_rollback);
  EXPECT_EQ(done->progress().rolled_back_to_step(), first_rollback);
  ASSERT_THAT(done->recovery().rollbacks(), SizeIs(1));
  // Every rank ran to the last step; the model is as good as an undisturbed run's.
  EXPECT_EQ(done->progress().step(), kEpochs * 300);
  EXPECT_GE(done->progress().test_accuracy(), 0.84);
  EXPECT_EQ(done->export_path(), c.dir() + "/model.safetensors");
  // The servers' optimizer state came through the rollback and the hand-over: every block's
  // count of applied updates at the end is that of a run that never stopped (one per worker and
  // step): not that of one restarted from fresh tables, and no step of the lost worker's
  // applied twice or skipped when its rank moved.
  ExpectEveryUpdateAppliedOnce(ckpt + "/" + id, *done);
  if (HasFailure()) ADD_FAILURE() << c.LogTails(400);
  auto metrics = c.SchedulerMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("pscluster_scheduler_job_recoveries_total 1"));
  EXPECT_THAT(*metrics, HasSubstr("pscluster_scheduler_rank_handovers_total 1"));
}

// replication: 2: each shard also lives on the other server, kept in step by its primary. A
// server killed with SIGKILL costs no rollback: its shards' backups take over as primaries and
// every rank resumes where the servers had it.
TEST(E2eRecoveryTest, WithReplicasAKilledServerCostsNoRollback) {
  auto cluster = E2eCluster::Start("replicated");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string ckpt = c.dir() + "/ckpt";
  ASSERT_TRUE(SubmitReplicatedJob(c, "replicated", 8, 2, 2, ckpt));
  const std::string id = "job-1";
  v1::Job seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(120), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= 2 * kCheckpointEvery;
  })) << seen.DebugString() << c.LogTails();
  ASSERT_THAT(seen.servers(), SizeIs(2));
  // Both servers hold a copy of the other's shards.
  for (const std::string& s : seen.servers()) {
    auto st = c.ServerStatus(s);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ(st->jobs_size(), 1) << s;
    EXPECT_EQ(st->jobs(0).replicas_size(), 1) << s;
  }
  const std::string dead = BusiestServer(ckpt + "/" + id, seen.servers());
  const std::string kept = seen.servers(0) == dead ? seen.servers(1) : seen.servers(0);
  ASSERT_TRUE(c.processes().Signal(dead, SIGKILL).ok()) << dead;

  ASSERT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->recovery().promotions() == 1 && j->state() == v1::JOB_RUNNING;
  })) << seen.DebugString() << c.LogTails();
  EXPECT_THAT(seen.servers(), ::testing::ElementsAre(kept));
  EXPECT_THAT(seen.recovery().last_cause(), HasSubstr(absl::StrCat("server holding shards ", dead)));
  ASSERT_TRUE(ExpectPromotedWithoutRollback(c, id, ckpt, 1, 8).has_value());
  CommandResult status = c.Psctl({"status", id});
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("1 promotion(s)"));
  if (HasFailure()) ADD_FAILURE() << c.LogTails(300);
}

// replication: 2 over three servers: after the first server is killed and its backups take
// over, the shards that lost a copy get a new one on another survivor; so when a second server
// is killed, its shards' backups take over again, still with no rollback.
TEST(E2eRecoveryTest, WithReplicasTwoServersKilledOneAfterTheOtherCostNoRollback) {
  E2eClusterOptions o;
  o.servers = 3;
  auto cluster = E2eCluster::Start("replicated3", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string ckpt = c.dir() + "/ckpt";
  ASSERT_TRUE(SubmitReplicatedJob(c, "replicated3", 12, 3, 2, ckpt));
  const std::string id = "job-1";
  v1::Job seen;
  auto running_past = [&](int64_t step, uint32_t promotions) {
    return [&, step, promotions] {
      auto j = c.GetJob(id);
      if (j.ok()) seen = *j;
      return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= step &&
             j->recovery().promotions() == promotions;
    };
  };
  ASSERT_TRUE(WaitFor(absl::Seconds(120), running_past(kCheckpointEvery, 0)))
      << seen.DebugString() << c.LogTails();
  ASSERT_THAT(seen.servers(), SizeIs(3));
  const std::string first = seen.servers(0);
  ASSERT_TRUE(c.processes().Signal(first, SIGKILL).ok()) << first;
  ASSERT_TRUE(WaitFor(absl::Seconds(60), running_past(0, 1)))
      << seen.DebugString() << c.LogTails();
  ASSERT_THAT(seen.servers(), SizeIs(2));
  EXPECT_THAT(seen.servers(), Not(Contains(first)));
  const int64_t at = seen.progress().step();
  ASSERT_TRUE(WaitFor(absl::Seconds(120), running_past(at + kCheckpointEvery, 1)))
      << seen.DebugString() << c.LogTails();
  const std::string second = seen.servers(0);
  ASSERT_TRUE(c.processes().Signal(second, SIGKILL).ok()) << second;

  auto done = ExpectPromotedWithoutRollback(c, id, ckpt, 2, 12);
  ASSERT_TRUE(done.has_value());
  EXPECT_THAT(done->servers(), SizeIs(1));
  if (HasFailure()) ADD_FAILURE() << c.LogTails(300);
}

// replication: 3 over three servers (every shard on every server): when a server is killed, each
// shard it was primary of is promoted on its first backup, and its second backup copies the new
// primary afresh (what it held came from the lost one); no rollback, and the shards keep two
// copies on the two survivors.
TEST(E2eRecoveryTest, WithThreeCopiesAKilledPrimaryIsPromotedAndItsOtherBackupFollowsTheNewOne) {
  E2eClusterOptions o;
  o.servers = 3;
  auto cluster = E2eCluster::Start("three_copies", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string ckpt = c.dir() + "/ckpt";
  ASSERT_TRUE(SubmitReplicatedJob(c, "three-copies", 8, 3, 3, ckpt));
  const std::string id = "job-1";
  v1::Job seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(120), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= kCheckpointEvery;
  })) << seen.DebugString() << c.LogTails();
  ASSERT_THAT(seen.servers(), SizeIs(3));
  auto before = c.GetShardMap(id);
  ASSERT_TRUE(before.ok()) << before.status();
  for (const v1::ShardAssignment& a : before->assignments()) {
    ASSERT_EQ(a.backups_size(), 2) << a.DebugString();
  }
  const std::string dead = before->assignments(0).primary();
  ASSERT_TRUE(c.processes().Signal(dead, SIGKILL).ok()) << dead;

  auto done = ExpectPromotedWithoutRollback(c, id, ckpt, 1, 8);
  ASSERT_TRUE(done.has_value());
  EXPECT_THAT(done->servers(), SizeIs(2));
  EXPECT_THAT(done->servers(), Not(Contains(dead)));
  auto after = c.GetShardMap(id);
  ASSERT_TRUE(after.ok()) << after.status();
  for (const v1::ShardAssignment& a : after->assignments()) {
    EXPECT_NE(a.primary(), dead);
    ASSERT_EQ(a.backups_size(), 1) << a.DebugString();
    EXPECT_NE(a.backups(0), a.primary());
    EXPECT_NE(a.backups(0), dead);
  }
  if (HasFailure()) ADD_FAILURE() << c.LogTails(300);
}

TEST(E2eRecoveryTest, APausedWorkersRankIsHandedOverAndItsTaskStopsWhenItWakes) {
  E2eClusterOptions o;
  o.workers = 3;
  auto cluster = E2eCluster::Start("paused", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string ckpt = c.dir() + "/ckpt";
  std::string yaml = absl::StrCat(FashionJobYaml("sleeper", 6, ""), "checkpoint_every_steps: ",
                                  kCheckpointEvery, "\n", "checkpoint_dir: ", ckpt, "\n");
  CommandResult submit = c.Psctl({"submit", c.WriteFile("job.yaml", yaml)});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  const std::string id = "job-1";
  v1::Job seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(120), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= 300;
  })) << seen.DebugString() << c.LogTails();
  const std::string sleeper = seen.workers(1);
  // SIGSTOP: the process holds its connections and its task, but says nothing.
  ASSERT_TRUE(c.processes().Signal(sleeper, SIGSTOP).ok()) << sleeper;
  ASSERT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->recovery().handovers() == 1;
  })) << seen.DebugString() << c.LogTails();
  EXPECT_NE(seen.workers(1), sleeper);
  EXPECT_THAT(seen.recovery().last_cause(),
              HasSubstr(absl::StrCat("worker of rank 1 ", sleeper)));
  // It wakes up with its old task half-way through a step, while another worker runs its rank:
  // its pushes are duplicates of the new worker's, and its next progress report stops it.
  ASSERT_TRUE(c.processes().Signal(sleeper, SIGCONT).ok()) << sleeper;
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    auto w = c.WorkerStatus(sleeper);
    return w.ok() && !w->busy();
  })) << c.LogTails();
  auto done = c.WaitForEnd(id, absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().handovers(), 1u);
  EXPECT_EQ(done->recovery().recoveries(), 0u);
  EXPECT_EQ(done->progress().rolled_back_to_step(), -1);
  EXPECT_GE(done->progress().test_accuracy(), 0.83);
  ExpectEveryUpdateAppliedOnce(ckpt + "/" + id, *done);
  // The woken worker is a member of the cluster again, free for the next job.
  auto nodes = c.ClusterStatus();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  for (const v1::NodeStatus& n : nodes->nodes()) {
    if (n.info().node_id() == sleeper) {
      EXPECT_EQ(n.state(), v1::NODE_ALIVE);
    }
  }
}

}  // namespace
}  // namespace pscluster::testing
