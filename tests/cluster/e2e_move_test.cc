// End to end with the real daemons: a virtual shard moves live between the job's two servers
// (`psctl move-shard`) while both workers train. The target takes a live copy, catches up and
// becomes the shard's primary; the workers only refresh their shard map. The job succeeds with
// every update applied exactly once, and the moved shard is served by its new primary.

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/e2e_cluster.h"
#include "tests/cluster/exactly_once.h"

namespace pscluster::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kEpochs = 8;
constexpr int kHidden = 256;
constexpr int kCheckpointEvery = 100;

// Submits a Fashion-MNIST job (`hidden` units, `epochs`) with periodic checkpoints under `ckpt`
// and waits until it runs past `step`; `seen` gets its last state. False (reported) otherwise.
bool SubmitAndRunPast(E2eCluster& c, const std::string& name, int epochs, int hidden,
                      const std::string& ckpt, int64_t step, v1::Job* seen,
                      const std::string& more_yaml = "") {
  const std::string yaml = absl::StrCat(FashionJobYaml(name, epochs, "", hidden),
                                        "checkpoint_every_steps: ", kCheckpointEvery, "\n",
                                        "checkpoint_dir: ", ckpt, "\n", more_yaml);
  CommandResult submit = c.Psctl({"submit", c.WriteFile("job.yaml", yaml)});
  if (submit.exit_code != 0) {
    ADD_FAILURE() << submit.output;
    return false;
  }
  const bool running = WaitFor(absl::Seconds(120), [&] {
    auto j = c.GetJob("job-1");
    if (j.ok()) *seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= step;
  });
  if (!running) ADD_FAILURE() << seen->DebugString() << c.LogTails();
  return running;
}

// Waits (up to `timeout`) until the rebalancer has done a move of job `id`; *seen gets the job's
// last state. The move, or one in state MOVE_UNSPECIFIED when there was none by then.
v1::ShardMove WaitForRebalancerMove(E2eCluster& c, const std::string& id, absl::Duration timeout,
                                    v1::Job* seen) {
  v1::ShardMove found;
  WaitFor(timeout, [&] {
    auto j = c.GetJob(id);
    if (!j.ok()) return false;
    *seen = *j;
    for (const v1::ShardMove& m : seen->moves()) {
      if (absl::StartsWith(m.reason(), "rebalance: ") && m.state() == v1::MOVE_DONE) {
        found = m;
        return true;
      }
    }
    return seen->state() != v1::JOB_RUNNING;
  });
  return found;
}

// The shard of job `id` with the most traffic, once the servers have reported some (up to 30 s).
absl::StatusOr<uint32_t> BusiestShard(E2eCluster& c, const std::string& id) {
  v1::ClusterStatusResponse status;
  const bool reported = WaitFor(absl::Seconds(30), [&] {
    auto st = c.ClusterStatus();
    if (!st.ok()) return false;
    status = *st;
    for (const auto& l : st->shard_loads()) {
      if (l.job_id() == id && l.load().bytes_per_sec() > 0) return true;
    }
    return false;
  });
  if (!reported) {
    return absl::DeadlineExceededError(
        absl::StrCat("no shard load of ", id, " reported: ", status.DebugString()));
  }
  uint32_t shard = 0;
  double hottest = -1;
  for (const auto& l : status.shard_loads()) {
    if (l.job_id() == id && l.load().bytes_per_sec() > hottest) {
      hottest = l.load().bytes_per_sec();
      shard = l.shard();
    }
  }
  return shard;
}

// The job `id` succeeds with no rollback, at least one move, a trained model, and every update
// applied once (its checkpoints under `ckpt`).
void ExpectSucceededWithEveryUpdateOnce(E2eCluster& c, const std::string& id,
                                        const std::string& ckpt) {
  auto done = c.WaitForEnd(id, absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().recoveries(), 0u);
  EXPECT_GE(done->shard_moves(), 1u);
  EXPECT_GE(done->progress().test_accuracy(), 0.8);
  ExpectEveryUpdateAppliedOnce(ckpt + "/" + id, *done);
}

TEST(E2eMoveTest, AShardMovedWhileTheJobTrainsKeepsEveryUpdateExactlyOnce) {
  auto cluster = E2eCluster::Start("move", E2eClusterOptions());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string ckpt = c.dir() + "/ckpt";
  const std::string id = "job-1";
  v1::Job seen;
  // Running, and far enough in that every shard with blocks has reported traffic.
  ASSERT_TRUE(SubmitAndRunPast(c, "moving", kEpochs, kHidden, ckpt, 150, &seen));

  // The busiest shard moves to the other server.
  auto map = c.GetShardMap(id);
  ASSERT_TRUE(map.ok()) << map.status();
  auto busiest = BusiestShard(c, id);
  ASSERT_TRUE(busiest.ok()) << busiest.status();
  const uint32_t shard = *busiest;
  const std::string from = map->assignments(static_cast<int>(shard)).primary();
  ASSERT_EQ(seen.servers_size(), 2);
  const std::string to = seen.servers(0) == from ? seen.servers(1) : seen.servers(0);
  CommandResult moved =
      c.Psctl({"move-shard", id, absl::StrCat(shard), to}, absl::Seconds(90));
  ASSERT_EQ(moved.exit_code, 0) << moved.output << c.LogTails();
  EXPECT_THAT(moved.output, HasSubstr(absl::StrCat("moving shard ", shard, " of ", id, " from ",
                                                   from, " to ", to)));
  EXPECT_THAT(moved.output, HasSubstr(absl::StrCat("done: copied in")));
  auto after = c.GetShardMap(id);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->assignments(static_cast<int>(shard)).primary(), to);
  EXPECT_TRUE(after->assignments(static_cast<int>(shard)).backups().empty());
  EXPECT_EQ(after->epoch(), map->epoch() + 2);
  auto running = c.GetJob(id);
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->state(), v1::JOB_RUNNING) << running->reason();
  EXPECT_LT(running->progress().step(), kEpochs * 300) << "the move is meant to happen mid-run";
  CommandResult shown = c.Psctl({"status", id});
  EXPECT_THAT(shown.output, HasSubstr("Shard moves:")) << shown.output;
  EXPECT_THAT(shown.output, HasSubstr(absl::StrCat("1 done; last: shard ", shard)))
      << shown.output;
  // The target serves the shard: it is in its Status as a primary shard, with traffic.
  auto target = E2eCluster::ServerStatusAt(after->servers(0).node_id() == to
                                               ? after->servers(0).address()
                                               : after->servers(1).address());
  ASSERT_TRUE(target.ok()) << target.status();
  ASSERT_EQ(target->jobs_size(), 1);
  EXPECT_THAT(target->jobs(0).shards(), ::testing::Contains(shard));
  EXPECT_EQ(target->jobs(0).replicas_size(), 0);

  auto done = c.WaitForEnd(id, absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().recoveries(), 0u);
  EXPECT_EQ(done->shard_moves(), 1u);
  ASSERT_EQ(done->moves_size(), 1);
  EXPECT_EQ(done->moves(0).state(), v1::MOVE_DONE);
  EXPECT_EQ(done->progress().step(), kEpochs * 300);
  EXPECT_GE(done->progress().test_accuracy(), 0.8);
  // Every block, the moved shard's included, was updated once per worker and step.
  ExpectEveryUpdateAppliedOnce(ckpt + "/" + id, *done);
  auto metrics = c.SchedulerMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("pscluster_scheduler_shard_moves_total 1"));
  if (HasFailure()) ADD_FAILURE() << c.LogTails(100);
}

// A replicated job (two copies of every shard on the job's two servers; a third server spare):
// the busiest shard's primary moves to the spare, and the shard's backup keeps the copy it holds
// (its old primary hands it everything, its new primary sends it clocks, not a snapshot). The new
// primary is killed with SIGKILL right after: the backup takes the shard over, no rollback, and
// every update is applied once.
TEST(E2eMoveTest, ANewPrimaryKilledRightAfterAMoveIsReplacedByTheBackupThatKeptItsCopy) {
  E2eClusterOptions o;
  o.servers = 3;
  auto cluster = E2eCluster::Start("move-kept-copy", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string ckpt = c.dir() + "/ckpt";
  const std::string id = "job-1";
  v1::Job seen;
  ASSERT_TRUE(
      SubmitAndRunPast(c, "kept-copy", kEpochs, kHidden, ckpt, 150, &seen, "replication: 2\n"));
  ASSERT_EQ(seen.servers_size(), 2);
  auto busiest = BusiestShard(c, id);
  ASSERT_TRUE(busiest.ok()) << busiest.status();
  const uint32_t shard = *busiest;
  auto map = c.GetShardMap(id);
  ASSERT_TRUE(map.ok()) << map.status();
  const v1::ShardAssignment& a = map->assignments(static_cast<int>(shard));
  ASSERT_EQ(a.backups_size(), 1);
  const std::string from = a.primary(), backup = a.backups(0);
  std::string spare;
  for (int i = 1; i <= 3; ++i) {
    const std::string s = absl::StrCat("server-", i);
    if (s != seen.servers(0) && s != seen.servers(1)) spare = s;
  }
  ASSERT_FALSE(spare.empty());

  CommandResult moved =
      c.Psctl({"move-shard", id, absl::StrCat(shard), spare}, absl::Seconds(90));
  ASSERT_EQ(moved.exit_code, 0) << moved.output << c.LogTails();
  EXPECT_THAT(moved.output, HasSubstr("done: copied in"));
  auto after = c.GetShardMap(id);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->assignments(static_cast<int>(shard)).primary(), spare);
  EXPECT_THAT(after->assignments(static_cast<int>(shard)).backups(), ElementsAre(backup));
  // The backup holds the shard under its new primary, exact already.
  auto st = c.ServerStatus(backup);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->jobs_size(), 1);
  bool held = false;
  for (const v1::ReplicaOnServer& r : st->jobs(0).replicas()) {
    if (r.primary() != spare) continue;
    EXPECT_TRUE(r.caught_up());
    held = std::find(r.shards().begin(), r.shards().end(), shard) != r.shards().end();
  }
  EXPECT_TRUE(held) << st->DebugString();
  std::ifstream log(c.processes().LogFile(backup));
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr(absl::StrCat("copy took its new shards from the copy of ", from,
                                           "'s shards here (with its primary's clocks")));

  ASSERT_TRUE(c.processes().Signal(spare, SIGKILL).ok()) << spare;
  auto done = c.WaitForEnd(id, absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().promotions(), 1u);
  EXPECT_EQ(done->recovery().recoveries(), 0u) << "no rollback";
  EXPECT_EQ(done->progress().rolled_back_to_step(), -1);
  EXPECT_EQ(done->progress().step(), kEpochs * 300);
  EXPECT_GE(done->progress().test_accuracy(), 0.8);
  ExpectEveryUpdateAppliedOnce(ckpt + "/" + id, *done);
  if (HasFailure()) ADD_FAILURE() << c.LogTails(100);
}

// The rebalancer undoes an imbalance: every shard is piled onto one server by hand (psctl),
// and the scheduler (looking every 1.5 s, a period after the last move) moves hot shards off
// it again, live, by itself.
TEST(E2eMoveTest, TheRebalancerSpreadsShardsPiledOntoOneServer) {
  E2eClusterOptions o;
  o.scheduler_args = {"--rebalance_every_ms=1500", "--rebalance_min_mb_per_sec=0.1"};
  auto cluster = E2eCluster::Start("rebalance", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string ckpt = c.dir() + "/ckpt";
  const std::string id = "job-1";
  v1::Job seen;
  ASSERT_TRUE(SubmitAndRunPast(c, "rebalanced", 10, 512, ckpt, 50, &seen));
  ASSERT_EQ(seen.servers_size(), 2);
  const std::string pile = seen.servers(0);
  auto map = c.GetShardMap(id);
  ASSERT_TRUE(map.ok()) << map.status();
  int piled = 0;
  for (const v1::ShardAssignment& a : map->assignments()) {
    if (a.primary() == pile) continue;
    // Refused while the rebalancer moves one itself: that is what the test is after anyway.
    CommandResult moved =
        c.Psctl({"move-shard", id, absl::StrCat(a.shard()), pile}, absl::Seconds(90));
    piled += moved.exit_code == 0;
  }
  const v1::ShardMove by_rebalancer = WaitForRebalancerMove(c, id, absl::Seconds(60), &seen);
  ASSERT_EQ(by_rebalancer.state(), v1::MOVE_DONE)
      << "moved by hand: " << piled << "\n" << seen.DebugString() << c.LogTails();
  EXPECT_THAT(by_rebalancer.reason(), HasSubstr("MB/s"));
  EXPECT_THAT(by_rebalancer.result(), HasSubstr("copied in"));
  ExpectSucceededWithEveryUpdateOnce(c, id, ckpt);
  if (HasFailure()) ADD_FAILURE() << c.LogTails(100);
}

// A replicated job (two copies of every shard over three servers): primaries are piled onto one
// server by hand, each move onto a server that already backs the old primary's other shards
// (the new primary takes its copy over); the rebalancer (looking every 1.5 s) then moves a hot
// shard off it, to a server that holds no copy of that shard. With the real daemons; every
// shard keeps its two copies on two servers, and the job succeeds with every update applied
// once and no rollback.
TEST(E2eMoveTest, TheRebalancerMovesAReplicatedJobsShardsAndKeepsTheirCopies) {
  E2eClusterOptions o;
  o.servers = 3;
  o.scheduler_args = {"--rebalance_every_ms=1500", "--rebalance_min_mb_per_sec=0.1"};
  auto cluster = E2eCluster::Start("rebalance-replicated", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string ckpt = c.dir() + "/ckpt";
  const std::string id = "job-1";
  const std::string yaml = absl::StrCat(
      absl::StrReplaceAll(FashionJobYaml("replicated", 10, "", 512),
                          {{"num_servers: 2", "num_servers: 3"}}),
      "replication: 2\n", "checkpoint_every_steps: ", kCheckpointEvery, "\n",
      "checkpoint_dir: ", ckpt, "\n");
  CommandResult submit = c.Psctl({"submit", c.WriteFile("job.yaml", yaml)});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  v1::Job seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(120), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= 50;
  })) << seen.DebugString() << c.LogTails();
  ASSERT_EQ(seen.servers_size(), 3);
  const std::string pile = seen.servers(0);
  auto before = c.GetShardMap(id);
  ASSERT_TRUE(before.ok()) << before.status();
  int piled = 0;
  for (const v1::ShardAssignment& a : before->assignments()) {
    if (a.primary() == pile ||
        std::find(a.backups().begin(), a.backups().end(), pile) != a.backups().end()) {
      continue;  // Already there, or it backs the shard (a primary never joins its own copy).
    }
    // Refused while the rebalancer moves one itself: that is what the test is after anyway.
    CommandResult moved =
        c.Psctl({"move-shard", id, absl::StrCat(a.shard()), pile}, absl::Seconds(90));
    piled += moved.exit_code == 0;
  }
  const v1::ShardMove by_rebalancer = WaitForRebalancerMove(c, id, absl::Seconds(120), &seen);
  ASSERT_EQ(by_rebalancer.state(), v1::MOVE_DONE)
      << "moved by hand: " << piled << "\n" << seen.DebugString() << c.LogTails();
  EXPECT_THAT(by_rebalancer.result(), HasSubstr("copied in"));

  // After the move every shard still has one backup, on another server than its primary.
  EXPECT_NE(by_rebalancer.to(), by_rebalancer.from());
  auto map = c.GetShardMap(id);
  ASSERT_TRUE(map.ok()) << map.status();
  for (const v1::ShardAssignment& a : map->assignments()) {
    ASSERT_EQ(a.backups_size(), 1) << "shard " << a.shard() << ": " << map->DebugString();
    EXPECT_NE(a.backups(0), a.primary()) << "shard " << a.shard();
  }

  ExpectSucceededWithEveryUpdateOnce(c, id, ckpt);
  auto final_map = c.GetShardMap(id);
  if (final_map.ok()) {
    for (const v1::ShardAssignment& a : final_map->assignments()) {
      EXPECT_EQ(a.backups_size(), 1) << "shard " << a.shard() << " at the end";
    }
  }
  if (HasFailure()) ADD_FAILURE() << c.LogTails(100);
}

}  // namespace
}  // namespace pscluster::testing
