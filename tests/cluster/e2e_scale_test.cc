// End to end with the real daemons: elastic servers. A job grows from 2 to 3 servers and back
// to 2 while it trains (`psctl scale`), a server used by two jobs is drained (`psctl drain`) and
// then killed with nothing lost, and a server joining a job, or one whose shard is being moved
// off, is killed in the middle of the scale-out (the job recovers as from any lost server).
// Every update is applied exactly once where no node was lost.
#include <algorithm>
#include <csignal>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/e2e_cluster.h"
#include "tests/cluster/exactly_once.h"

namespace pscluster::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

constexpr int kCheckpointEvery = 100;

std::string JobYaml(E2eCluster& c, const std::string& name, int epochs, int hidden) {
  return absl::StrCat(FashionJobYaml(name, epochs, "", hidden),
                      "checkpoint_every_steps: ", kCheckpointEvery, "\n",
                      "checkpoint_dir: ", c.dir(), "/ckpt\n");
}

// Submits and waits until job `id` runs past `step` (false, reported, otherwise).
bool SubmitAndRunPast(E2eCluster& c, const std::string& yaml, const std::string& id,
                      int64_t step) {
  CommandResult submit = c.Psctl({"submit", c.WriteFile(id + ".yaml", yaml)});
  if (submit.exit_code != 0) {
    ADD_FAILURE() << submit.output;
    return false;
  }
  v1::Job seen;
  const bool running = WaitFor(absl::Seconds(120), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= step;
  });
  if (!running) ADD_FAILURE() << seen.DebugString() << c.LogTails();
  return running;
}

int PrimariesOn(const v1::ShardMap& map, const std::string& node) {
  int n = 0;
  for (const v1::ShardAssignment& a : map.assignments()) n += a.primary() == node;
  return n;
}

// Job `id` ends SUCCEEDED after `epochs` epochs, with no recovery or promotion, off `node`, and
// every update applied once.
void ExpectSucceededWithNothingLost(E2eCluster& c, const std::string& id, int epochs,
                                    const std::string& node) {
  auto done = c.WaitForEnd(id, absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().recoveries(), 0u) << id;
  EXPECT_EQ(done->recovery().promotions(), 0u) << id;
  EXPECT_THAT(done->servers(), Not(Contains(node)));
  EXPECT_EQ(done->progress().step(), epochs * 300);
  EXPECT_GE(done->progress().test_accuracy(), 0.8);
  ExpectEveryUpdateAppliedOnce(c.dir() + "/ckpt/" + id, *done);
}

// Starts job-1 and job-2 for `epochs` (with `extra` YAML) one after the other, each running past
// step 20; returns a server both use ("" and a failure when there is none).
std::string StartTwoJobs(E2eCluster& c, const std::map<std::string, int>& epochs,
                         const std::string& extra) {
  const std::map<std::string, std::string> names = {{"job-1", "first"}, {"job-2", "second"}};
  for (const auto& [id, n] : epochs) {
    if (!SubmitAndRunPast(c, absl::StrCat(JobYaml(c, names.at(id), n, 128), extra), id, 20)) {
      return "";
    }
  }
  auto a = c.GetJob("job-1");
  auto b = c.GetJob("job-2");
  if (!a.ok() || !b.ok()) {
    ADD_FAILURE() << a.status() << " " << b.status();
    return "";
  }
  for (const std::string& s : b->servers()) {
    if (std::find(a->servers().begin(), a->servers().end(), s) != a->servers().end()) return s;
  }
  ADD_FAILURE() << "no server both jobs use: " << a->DebugString() << b->DebugString();
  return "";
}

TEST(E2eScaleTest, AJobGrowsToThreeServersAndBackToTwoWhileItTrains) {
  E2eClusterOptions o;
  o.servers = 3;
  auto cluster = E2eCluster::Start("scale", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string id = "job-1";
  constexpr int kEpochs = 6;
  ASSERT_TRUE(SubmitAndRunPast(c, JobYaml(c, "elastic", kEpochs, 256), id, 150));
  auto before = c.GetShardMap(id);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->servers_size(), 2);

  CommandResult grown = c.Psctl({"scale", id, "--servers", "3"}, absl::Seconds(120));
  ASSERT_EQ(grown.exit_code, 0) << grown.output << c.LogTails();
  EXPECT_THAT(grown.output, HasSubstr("done: 3 server(s)"));
  auto wide = c.GetShardMap(id);
  ASSERT_TRUE(wide.ok()) << wide.status();
  ASSERT_EQ(wide->servers_size(), 3);
  const std::string added = wide->servers(2).node_id();
  const int share = PrimariesOn(*wide, added);
  EXPECT_GE(share, static_cast<int>(wide->num_virtual_shards()) / 3);
  // The new server serves its shards, with the job's tables.
  auto st = c.ServerStatus(added);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->jobs_size(), 1);
  EXPECT_THAT(st->jobs(0).shards(), SizeIs(share));
  EXPECT_FALSE(st->jobs(0).tables().empty());
  auto mid = c.GetJob(id);
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(mid->state(), v1::JOB_RUNNING) << mid->reason();
  EXPECT_LT(mid->progress().step(), kEpochs * 300) << "the change is meant to happen mid-run";
  CommandResult shown = c.Psctl({"status", id});
  EXPECT_THAT(shown.output, HasSubstr("Servers change:")) << shown.output;

  CommandResult shrunk = c.Psctl({"scale", id, "--servers", "2"}, absl::Seconds(120));
  ASSERT_EQ(shrunk.exit_code, 0) << shrunk.output << c.LogTails();
  EXPECT_THAT(shrunk.output, HasSubstr("done: 2 server(s)"));
  auto narrow = c.GetShardMap(id);
  ASSERT_TRUE(narrow.ok());
  EXPECT_EQ(narrow->servers_size(), 2);
  EXPECT_EQ(PrimariesOn(*narrow, added), 0);
  auto still = c.GetJob(id);
  ASSERT_TRUE(still.ok());
  EXPECT_LT(still->progress().step(), kEpochs * 300) << "the change is meant to happen mid-run";

  auto done = c.WaitForEnd(id, absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().recoveries(), 0u);
  EXPECT_THAT(done->servers(), Not(Contains(added)));
  EXPECT_EQ(done->progress().step(), kEpochs * 300);
  EXPECT_GE(done->progress().test_accuracy(), 0.8);
  ExpectEveryUpdateAppliedOnce(c.dir() + "/ckpt/" + id, *done);
  if (HasFailure()) ADD_FAILURE() << c.LogTails(100);
}

// A server used by two unreplicated jobs is drained while both train (the shards of each move
// back to back, to the other servers of the job or of the cluster), then killed: nothing lost.
TEST(E2eScaleTest, ADrainedServerOfTwoJobsCanBeKilledWithNothingLost) {
  E2eClusterOptions o;
  o.servers = 3;
  o.workers = 4;
  auto cluster = E2eCluster::Start("drain", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  // The first job runs long enough to still run when the second one has started.
  const std::map<std::string, int> epochs = {{"job-1", 10}, {"job-2", 4}};
  const std::string node = StartTwoJobs(c, epochs, "");
  ASSERT_FALSE(node.empty());

  CommandResult drained = c.Psctl({"drain", node}, absl::Seconds(120));
  ASSERT_EQ(drained.exit_code, 0) << drained.output << c.LogTails();
  EXPECT_THAT(drained.output, HasSubstr(absl::StrCat(node, " is drained")));
  CommandResult nodes = c.Psctl({"nodes"});
  EXPECT_THAT(nodes.output, HasSubstr("drained")) << nodes.output;
  for (const std::string id : {"job-1", "job-2"}) {
    auto running = c.GetJob(id);
    ASSERT_TRUE(running.ok());
    EXPECT_EQ(running->state(), v1::JOB_RUNNING) << id << ": the drain is meant to happen mid-run";
    EXPECT_THAT(drained.output, HasSubstr(id));
    auto map = c.GetShardMap(id);
    ASSERT_TRUE(map.ok());
    for (const v1::ServerEndpoint& ep : map->servers()) EXPECT_NE(ep.node_id(), node) << id;
  }
  // Stopped hard: nothing of either job was on it any more.
  ASSERT_TRUE(c.processes().Signal(node, SIGKILL).ok());

  for (const auto& [id, n] : epochs) {
    ExpectSucceededWithNothingLost(c, id, n, node);
  }
  if (HasFailure()) ADD_FAILURE() << c.LogTails(100);
}

// Two jobs with replicas (replication: 2) share a server holding primaries of each and backups
// of each; it is drained while both train: every copy on it moves (primaries and backups), the
// jobs keep two copies of every shard on distinct servers throughout, and the drained server is
// killed with nothing lost: no recovery, every update applied once.
TEST(E2eScaleTest, ADrainedServerOfTwoReplicatedJobsCanBeKilledWithNothingLost) {
  E2eClusterOptions o;
  o.servers = 3;
  o.workers = 4;
  auto cluster = E2eCluster::Start("drain_replicated", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::map<std::string, int> epochs = {{"job-1", 12}, {"job-2", 8}};
  const std::string node = StartTwoJobs(c, epochs, "replication: 2\n");
  ASSERT_FALSE(node.empty());
  for (const std::string id : {"job-1", "job-2"}) {
    auto map = c.GetShardMap(id);
    ASSERT_TRUE(map.ok());
    int primaries = 0, backups = 0;
    for (const v1::ShardAssignment& s : map->assignments()) {
      primaries += s.primary() == node;
      backups += std::count(s.backups().begin(), s.backups().end(), node);
    }
    ASSERT_GT(primaries, 0) << id;
    ASSERT_GT(backups, 0) << id;
  }

  CommandResult drained = c.Psctl({"drain", node}, absl::Seconds(240));
  ASSERT_EQ(drained.exit_code, 0) << drained.output << c.LogTails();
  EXPECT_THAT(drained.output, HasSubstr(absl::StrCat(node, " is drained")));
  for (const std::string id : {"job-1", "job-2"}) {
    auto running = c.GetJob(id);
    ASSERT_TRUE(running.ok());
    EXPECT_EQ(running->state(), v1::JOB_RUNNING) << id << ": the drain is meant to happen mid-run";
    int backup_moves = 0;
    for (const v1::ShardMove& m : running->moves()) {
      EXPECT_EQ(m.state(), v1::MOVE_DONE) << id << ": " << m.result();
      backup_moves += m.backup();
    }
    EXPECT_GT(backup_moves, 0) << id;
    auto map = c.GetShardMap(id);
    ASSERT_TRUE(map.ok());
    for (const v1::ServerEndpoint& ep : map->servers()) EXPECT_NE(ep.node_id(), node) << id;
    for (const v1::ShardAssignment& s : map->assignments()) {
      ASSERT_EQ(s.backups_size(), 1) << id << " shard " << s.shard();
      EXPECT_NE(s.primary(), s.backups(0)) << id << " shard " << s.shard();
    }
  }
  ASSERT_TRUE(c.processes().Signal(node, SIGKILL).ok());

  for (const auto& [id, n] : epochs) {
    ExpectSucceededWithNothingLost(c, id, n, node);
  }
  if (HasFailure()) ADD_FAILURE() << c.LogTails(100);
}

TEST(E2eScaleTest, TheJoiningServerKilledMidScaleOutTheJobRecoversAndSucceeds) {
  E2eClusterOptions o;
  o.servers = 4;  // One spare for the recovery.
  auto cluster = E2eCluster::Start("scale_kill", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string id = "job-1";
  constexpr int kEpochs = 4;
  ASSERT_TRUE(SubmitAndRunPast(c, JobYaml(c, "killed", kEpochs, 128), id, 2 * kCheckpointEvery + 20));
  auto scaling = c.StartPsctl({"scale", id, "--servers", "3"});
  ASSERT_TRUE(scaling.ok()) << scaling.status();
  // As soon as the joining server is in the job's map (its first shard copying or moved).
  std::string joining;
  ASSERT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto map = c.GetShardMap(id);
    if (!map.ok() || map->servers_size() < 3) return false;
    joining = map->servers(2).node_id();
    return true;
  })) << (*scaling)->Output() << c.LogTails();
  ASSERT_TRUE(c.processes().Signal(joining, SIGKILL).ok()) << joining;
  // The scale command ends, saying the change stopped.
  EXPECT_NE((*scaling)->Wait(absl::Seconds(120)), 0) << (*scaling)->Output();

  auto done = c.WaitForEnd(id, absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().recoveries(), 1u);
  EXPECT_THAT(done->recovery().last_cause(), HasSubstr(joining));
  EXPECT_THAT(done->servers(), Not(Contains(joining)));
  EXPECT_FALSE(done->elastic().active());
  EXPECT_EQ(done->progress().step(), kEpochs * 300);
  EXPECT_GE(done->progress().test_accuracy(), 0.8);
  if (HasFailure()) ADD_FAILURE() << c.LogTails(100);
}

// The source of a shard being moved to the joining server dies in the middle of the scale-out:
// the move stops and the job recovers from the lost server as from any other.
TEST(E2eScaleTest, TheSourceServerKilledMidScaleOutTheJobRecoversAndSucceeds) {
  E2eClusterOptions o;
  o.servers = 4;  // One joins, one is spare for the recovery.
  auto cluster = E2eCluster::Start("scale_kill_source", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string id = "job-1";
  constexpr int kEpochs = 4;
  ASSERT_TRUE(
      SubmitAndRunPast(c, JobYaml(c, "source", kEpochs, 128), id, 2 * kCheckpointEvery + 20));
  auto scaling = c.StartPsctl({"scale", id, "--servers", "3"});
  ASSERT_TRUE(scaling.ok()) << scaling.status();
  // As soon as a shard is being copied to the joining server: its current primary dies.
  std::string source;
  ASSERT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto j = c.GetJob(id);
    if (!j.ok() || j->moves().empty()) return false;
    const v1::ShardMove& m = *j->moves().rbegin();
    if (m.state() != v1::MOVE_COPYING && m.state() != v1::MOVE_QUEUED) return false;
    source = m.from();
    return !source.empty();
  })) << (*scaling)->Output() << c.LogTails();
  ASSERT_TRUE(c.processes().Signal(source, SIGKILL).ok()) << source;
  EXPECT_NE((*scaling)->Wait(absl::Seconds(120)), 0) << (*scaling)->Output();

  auto done = c.WaitForEnd(id, absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().recoveries(), 1u);
  EXPECT_THAT(done->recovery().last_cause(), HasSubstr(source));
  EXPECT_THAT(done->servers(), Not(Contains(source)));
  EXPECT_FALSE(done->elastic().active());
  EXPECT_EQ(done->progress().step(), kEpochs * 300);
  EXPECT_GE(done->progress().test_accuracy(), 0.8);
  if (HasFailure()) ADD_FAILURE() << c.LogTails(100);
}

}  // namespace
}  // namespace pscluster::testing
