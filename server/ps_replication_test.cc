// Replication and live shard moves through real in-process servers: backups that follow their
// primary and take over, copies seeded from checkpoints, acknowledgements that wait for backups,
// and a shard moving while workers train.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <tuple>

#include "common/channel.h"
#include "common/dtype.h"
#include "common/status_convert.h"
#include "server/initializer.h"
#include "server/testing/cluster.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

const v1::OptimizerSpec kSgd = Optimizer(v1::OptimizerSpec::SGD, 0.5f);

// Replication: with a backup for every shard on the other server, each primary forwards what it
// applies before it acknowledges it, so the backup's copy is bit for bit the primary's. When a
// server is lost, a map that makes the backup the primary (PromoteBackups) hands the copy over:
// a worker that resumes at its lowest clock re-pushes a half-done step, and every chunk lands
// exactly once.
TEST(ReplicationTest, BackupsFollowTheirPrimaryAndTakeOverWhenItIsLost) {
  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  for (int i = 0; i < 2; ++i) cluster.server(i)->handler()->set_node_id("s" + std::to_string(i));
  auto w = DenseSpec("w", {16, 500}, Optimizer(v1::OptimizerSpec::ADAM, 0.01f), 500);
  PsClientOptions opts;
  opts.job_id = "job";
  opts.call_timeout = absl::Seconds(20);
  auto client = PsClient::Create(opts, ReplicatedMap("job", 1, cluster.addresses()), {w});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->InstallShardMap().ok());
  ASSERT_TRUE((*client)->CreateTables(Mode(v1::ConsistencySpec::BSP), 1).ok());
  std::vector<float> g(8000), got(8000);
  auto grad = [&](int step) {
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.001f * i + step);
  };
  PushSources src{{{"w", g.data()}}, {}};
  PullTargets dst{{{"w", got.data()}}, {}};
  for (int step = 0; step < 5; ++step) {
    grad(step);
    ASSERT_TRUE((*client)->Push(step, src).ok()) << step;
  }
  // Step 5 half done: pushed everywhere, but not ended (its end-of-step never came).
  grad(5);
  ASSERT_TRUE((*client)->Push(5, src, /*end_of_step=*/false).ok());
  ASSERT_TRUE((*client)->Pull(5, dst).ok());
  const std::vector<float> before_loss = got;

  // The copies travelled over the backups' TCP data ports, as chunks of their own: each of the
  // 96 pushed chunks (6 pushes of 16 blocks) arrived at its primary and again at its backup.
  uint64_t chunks_in = 0;
  auto statuses = (*client)->ServerStatuses();
  ASSERT_TRUE(statuses.ok()) << statuses.status();
  for (const auto& st : *statuses) chunks_in += st.times().chunks_in();
  EXPECT_GE(chunks_in, 2u * 96u);
  // Each server holds a copy of the other's shards, at the primary's clocks.
  for (int i = 0; i < 2; ++i) {
    auto st = *(*client)->ServerStatuses();
    ASSERT_EQ(st[i].jobs(0).replicas_size(), 1) << i;
    const v1::ReplicaOnServer& r = st[i].jobs(0).replicas(0);
    EXPECT_EQ(r.primary(), i == 0 ? "s1" : "s0");
    EXPECT_EQ(r.shards_size(), 8);
    EXPECT_EQ(r.clocks(0).clock(), 5);
  }

  // s0 is lost: s1 becomes the primary of everything and adopts its copy of s0's shards.
  v1::ShardMap promoted = RoundRobinMap("job", 2, {cluster.addresses()[1]});
  for (auto& a : *promoted.mutable_assignments()) a.set_primary("s1");
  promoted.mutable_servers(0)->set_node_id("s1");
  v1::UpdateShardMapRequest req;
  *req.mutable_map() = promoted;
  req.set_self("s1");
  v1::UpdateShardMapResponse resp;
  ASSERT_TRUE(cluster.server(1)->handler()->UpdateShardMap(req, &resp).ok());
  opts.attempt = 1;
  auto resumed = PsClient::Create(opts, promoted, {w});
  ASSERT_TRUE(resumed.ok());
  std::fill(got.begin(), got.end(), 0.f);
  ASSERT_TRUE((*resumed)->Pull(5, dst).ok());
  EXPECT_EQ(got, before_loss) << "the copy is bit for bit what the primary had";
  // The resumed task pushes step 5 again: all of it was applied already, on both halves.
  grad(5);
  ASSERT_TRUE((*resumed)->Push(5, src).ok());
  auto st = *(*resumed)->ServerStatuses();
  EXPECT_EQ(st[0].jobs(0).clocks(0).clock(), 6);
  EXPECT_EQ(st[0].jobs(0).shards_size(), 16);
  EXPECT_EQ(st[0].jobs(0).replicas_size(), 0);
  EXPECT_EQ(st[0].duplicates_total(), 16u);
  std::fill(got.begin(), got.end(), 0.f);
  ASSERT_TRUE((*resumed)->Pull(6, dst).ok());
  EXPECT_EQ(got, before_loss);

  // The same run on one server, with no loss, ends with the same weights.
  InProcessCluster single(1);
  auto ref = single.Client("job", {w});
  ASSERT_TRUE(ref.ok());
  ASSERT_TRUE((*ref)->CreateTables(Mode(v1::ConsistencySpec::BSP), 1).ok());
  for (int step = 0; step < 6; ++step) {
    grad(step);
    ASSERT_TRUE((*ref)->Push(step, src).ok());
  }
  std::vector<float> expected(8000);
  ASSERT_TRUE((*ref)->Pull(6, {{{"w", expected.data()}}, {}}).ok());
  EXPECT_EQ(got, expected);
}

// After a rollback, a backup's copy starts from the same checkpoint files as the primaries
// (RestoreFilesFor gives a server the files of the shards it backs up too): should a primary be
// lost right after, the copy that takes over holds the restored weights.
TEST(ReplicationTest, ARolledBackJobsCopiesStartFromTheCheckpoints) {
  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  for (int i = 0; i < 2; ++i) cluster.server(i)->handler()->set_node_id("s" + std::to_string(i));
  auto w = DenseSpec("w", {16, 500}, Optimizer(v1::OptimizerSpec::ADAM, 0.01f), 500);
  PsClientOptions opts;
  opts.job_id = "job";
  auto client = PsClient::Create(opts, ReplicatedMap("job", 1, cluster.addresses()), {w});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->InstallShardMap().ok());
  ASSERT_TRUE((*client)->CreateTables(Mode(v1::ConsistencySpec::BSP), 1).ok());
  std::vector<float> g(8000, 0.5f), at3(8000), got(8000);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE((*client)->Push(step, {{{"w", g.data()}}, {}}).ok());
  }
  ASSERT_TRUE((*client)->Pull(3, {{{"w", at3.data()}}, {}}).ok());
  auto files = (*client)->Checkpoint(TempDir("replicated-ckpt"));
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);
  ASSERT_TRUE((*client)->DropJob().ok());

  // Placed again (epoch 2) with every server restoring from both files, then trained on.
  v1::ShardMap map2 = ReplicatedMap("job", 2, cluster.addresses());
  for (int i = 0; i < 2; ++i) {
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = map2;
    req.set_self("s" + std::to_string(i));
    for (const auto& f : *files) req.add_restore_from(f.path());
    req.set_restore_step(3);
    req.set_min_attempt(1);
    v1::UpdateShardMapResponse resp;
    ASSERT_TRUE(cluster.server(i)->handler()->UpdateShardMap(req, &resp).ok());
  }
  opts.attempt = 1;
  auto again = PsClient::Create(opts, map2, {w});
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->CreateTables(Mode(v1::ConsistencySpec::BSP), 1).ok());
  auto statuses = (*again)->ServerStatuses();
  ASSERT_TRUE(statuses.ok()) << statuses.status();
  for (const auto& st : *statuses) {
    ASSERT_EQ(st.jobs_size(), 1);
    ASSERT_EQ(st.jobs(0).replicas_size(), 1);
    EXPECT_EQ(st.jobs(0).replicas(0).clocks(0).clock(), 3) << "the copy starts at the step too";
  }
  // s0 is lost at once: s1's copy of its shards holds the restored weights.
  v1::ShardMap promoted = RoundRobinMap("job", 3, {cluster.addresses()[1]});
  for (auto& a : *promoted.mutable_assignments()) a.set_primary("s1");
  promoted.mutable_servers(0)->set_node_id("s1");
  v1::UpdateShardMapRequest req;
  *req.mutable_map() = promoted;
  req.set_self("s1");
  v1::UpdateShardMapResponse resp;
  ASSERT_TRUE(cluster.server(1)->handler()->UpdateShardMap(req, &resp).ok());
  auto last = PsClient::Create(opts, promoted, {w});
  ASSERT_TRUE(last.ok());
  ASSERT_TRUE((*last)->Pull(3, {{{"w", got.data()}}, {}}).ok());
  EXPECT_EQ(got, at3);
}

// Names the servers s0, s1, ... and returns map epoch 1 of "job" over them, each shard backed
// up on the server after its primary.
v1::ShardMap RingMap(InProcessCluster& cluster) {
  const size_t n = cluster.addresses().size();
  for (size_t i = 0; i < n; ++i) cluster.server(i)->handler()->set_node_id("s" + std::to_string(i));
  v1::ShardMap map = RoundRobinMap("job", 1, cluster.addresses());
  for (auto& a : *map.mutable_assignments()) {
    a.add_backups("s" + std::to_string((a.shard() + 1) % n));
  }
  return map;
}

// A single worker's BSP run over the 8,000 weights of `w` (Adam), with gradients that change
// every step: what the replication tests train, and the same run on one server with no loss,
// the weights they must end with.
struct CosineRun {
  v1::TableSpec w = DenseSpec("w", {16, 500}, Optimizer(v1::OptimizerSpec::ADAM, 0.01f), 500);
  std::vector<float> g = std::vector<float>(8000);
  PushSources src{{{"w", g.data()}}, {}};

  void Grad(int step) {
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::cos(0.002f * i + step);
  }
  void Train(PsClient* c, int from, int to) {
    for (int step = from; step < to; ++step) {
      Grad(step);
      ASSERT_TRUE(c->Push(step, src).ok()) << step;
    }
  }
  // The weights after `steps` steps on one server.
  std::vector<float> Reference(int steps) {
    InProcessCluster single(1);
    auto ref = single.Client("job", {w});
    EXPECT_TRUE(ref.ok());
    if (!ref.ok()) return {};
    EXPECT_TRUE((*ref)->CreateTables(Mode(v1::ConsistencySpec::BSP), 1).ok());
    Train(ref->get(), 0, steps);
    std::vector<float> expected(g.size());
    EXPECT_TRUE((*ref)->Pull(steps, {{{"w", expected.data()}}, {}}).ok());
    return expected;
  }
};

// Three servers, each shard backed up on the next one. s0 is lost: its shards go to s1, and the
// shards that lost a copy get a new one on the other survivor, started from a checkpoint of their
// primary (copy_from). Training goes on; then s1 is lost too, and s2 holds every shard: the
// weights are those of the same run on one server with no loss.
TEST(ReplicationTest, NewCopiesFromACheckpointSurviveASecondLoss) {
  InProcessCluster cluster(3);
  ASSERT_TRUE(cluster.status().ok());
  const std::vector<std::string>& addr = cluster.addresses();
  CosineRun run;
  const v1::TableSpec& w = run.w;
  const v1::ShardMap map1 = RingMap(cluster);
  PsClientOptions opts;
  opts.job_id = "job";
  auto client = PsClient::Create(opts, map1, {w});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->InstallShardMap().ok());
  ASSERT_TRUE((*client)->CreateTables(Mode(v1::ConsistencySpec::BSP), 1).ok());
  std::vector<float> got(8000);
  run.Train(client->get(), 0, 4);
  // Step 4 half done when s0 is lost: pushed everywhere, its end never sent. The worker pushes
  // it again after the losses; a copy seeded meanwhile must not apply it twice.
  run.Grad(4);
  ASSERT_TRUE((*client)->Push(4, run.src, /*end_of_step=*/false).ok());

  auto update = [&](int server, const v1::ShardMap& map, std::vector<v1::ReplicaSeed> seeds) {
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = map;
    req.set_self("s" + std::to_string(server));
    req.set_min_attempt(static_cast<uint32_t>(map.epoch()));
    for (auto& sd : seeds) *req.add_copy_from() = sd;
    v1::UpdateShardMapResponse resp;
    return cluster.server(server)->handler()->UpdateShardMap(req, &resp);
  };
  auto survivors = [&](v1::ShardMap m, const std::vector<int>& live) {
    m.clear_servers();
    for (int i : live) {
      auto* e = m.add_servers();
      e->set_node_id("s" + std::to_string(i));
      e->set_address(addr[i]);
    }
    return m;
  };
  // s0 lost: its shards' backups (s1) take over; s0 leaves every backup list.
  v1::ShardMap map2 = survivors(map1, {1, 2});
  map2.set_epoch(2);
  for (auto& a : *map2.mutable_assignments()) {
    if (a.primary() == "s0") a.set_primary("s1");
    a.clear_backups();
    if (a.primary() == "s1" && a.shard() % 3 == 1) a.add_backups("s2");  // s1's own: kept.
  }
  ASSERT_TRUE(update(1, map2, {}).ok());
  ASSERT_TRUE(update(2, map2, {}).ok());
  // New copies: every shard of s1 on s2 and of s2 on s1, from checkpoints taken now.
  const std::string seed_dir = TempDir("seeds");
  std::string path[3];
  for (int i : {1, 2}) {
    v1::CheckpointRequest ck;
    ck.set_job_id("job");
    ck.set_dir(seed_dir);
    v1::CheckpointResponse resp;
    ASSERT_TRUE(cluster.server(i)->handler()->Checkpoint(ck, &resp).ok());
    path[i] = resp.path();
  }
  v1::ShardMap map3 = map2;
  map3.set_epoch(3);
  for (auto& a : *map3.mutable_assignments()) {
    a.clear_backups();
    a.add_backups(a.primary() == "s1" ? "s2" : "s1");
  }
  v1::ReplicaSeed from1, from2;
  from1.set_primary("s1");
  from1.set_path(path[1]);
  from2.set_primary("s2");
  from2.set_path(path[2]);
  absl::Status refused = update(1, map3, {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("copy_from"), std::string::npos) << refused;
  ASSERT_TRUE(update(1, map3, {from2}).ok());
  ASSERT_TRUE(update(2, map3, {from1}).ok());
  opts.attempt = 3;
  auto resumed = PsClient::Create(opts, map3, {w});
  ASSERT_TRUE(resumed.ok());
  run.Train(resumed->get(), 4, 7);  // Step 4 again, then 5 and 6.

  // s1 lost too: s2 takes over its copy of everything s1 held.
  v1::ShardMap map4 = survivors(map3, {2});
  map4.set_epoch(4);
  for (auto& a : *map4.mutable_assignments()) {
    a.set_primary("s2");
    a.clear_backups();
  }
  ASSERT_TRUE(update(2, map4, {}).ok());
  opts.attempt = 4;
  auto last = PsClient::Create(opts, map4, {w});
  ASSERT_TRUE(last.ok());
  ASSERT_TRUE((*last)->Pull(7, {{{"w", got.data()}}, {}}).ok());
  EXPECT_EQ(got, run.Reference(7));
}

// The scheduler's answer to a backup its primary cannot reach (ReplaceBackups): the backup
// leaves the map, then another server of the job backs the primary's shards with a live copy
// while the worker goes on training. Each server gets that map with seed_new_backups, the new
// backup with a live seed; here the primary takes it first, so its snapshot reaches the new
// backup before the backup has the map (its queue retries). Then the primary is lost and the
// new copy takes over: the weights are those of the same run on one server with no loss.
TEST(ReplicationTest, ALiveReplacementBackupTakesOverWithTheWholeRun) {
  InProcessCluster cluster(3);
  ASSERT_TRUE(cluster.status().ok());
  const std::vector<std::string>& addr = cluster.addresses();
  CosineRun run;
  const v1::TableSpec& w = run.w;
  const v1::ShardMap map1 = RingMap(cluster);
  absl::Mutex map_mu;
  v1::ShardMap current = map1;
  PsClientOptions opts;
  opts.job_id = "job";
  opts.call_timeout = absl::Seconds(30);
  opts.refresh_shard_map = [&]() -> absl::StatusOr<v1::ShardMap> {
    absl::MutexLock l(&map_mu);
    return current;
  };
  auto client = PsClient::Create(opts, map1, {w});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->InstallShardMap().ok());
  ASSERT_TRUE((*client)->CreateTables(Mode(v1::ConsistencySpec::BSP), 1).ok());
  std::vector<float> got(8000);
  auto update = [&](int server, const v1::ShardMap& map, bool seed_new, const std::string& from) {
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = map;
    req.set_self("s" + std::to_string(server));
    req.set_seed_new_backups(seed_new);
    if (!from.empty()) {
      v1::ReplicaSeed* sd = req.add_copy_from();
      sd->set_primary(from);
      sd->set_live(true);
    }
    v1::UpdateShardMapResponse resp;
    return cluster.server(server)->handler()->UpdateShardMap(req, &resp);
  };
  run.Train(client->get(), 0, 3);
  // s0 cannot reach s1: s0's shards lose their backup (map 2).
  v1::ShardMap map2 = map1;
  map2.set_epoch(2);
  for (auto& a : *map2.mutable_assignments()) {
    if (a.primary() == "s0") a.clear_backups();
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(update(i, map2, false, "").ok()) << i;
  {
    absl::MutexLock l(&map_mu);
    current = map2;
  }
  run.Train(client->get(), 3, 5);
  // Map 3: s2 backs s0's shards, seeded live by s0 (s0 first, s2 last).
  v1::ShardMap map3 = map2;
  map3.set_epoch(3);
  for (auto& a : *map3.mutable_assignments()) {
    if (a.primary() == "s0") a.add_backups("s2");
  }
  ASSERT_TRUE(update(0, map3, true, "").ok());
  ASSERT_TRUE(update(1, map3, true, "").ok());
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(update(2, map3, true, "s0").ok());
  {
    absl::MutexLock l(&map_mu);
    current = map3;
  }
  run.Train(client->get(), 5, 8);

  // s0 lost: s2 takes over its copy of s0's shards.
  v1::ShardMap map4 = map3;
  map4.set_epoch(4);
  map4.clear_servers();
  for (int i : {1, 2}) {
    auto* e = map4.add_servers();
    e->set_node_id("s" + std::to_string(i));
    e->set_address(addr[i]);
  }
  for (auto& a : *map4.mutable_assignments()) {
    if (a.primary() == "s0") a.set_primary("s2");
    a.clear_backups();
  }
  ASSERT_TRUE(update(1, map4, false, "").ok());
  ASSERT_TRUE(update(2, map4, false, "").ok());
  opts.attempt = 1;
  opts.refresh_shard_map = nullptr;
  auto last = PsClient::Create(opts, map4, {w});
  ASSERT_TRUE(last.ok());
  ASSERT_TRUE((*last)->Pull(8, {{{"w", got.data()}}, {}}).ok());
  EXPECT_EQ(got, run.Reference(8));
}

// A live shard move: while two workers train (BSP push-pulls), shard 0 moves from s0 to s1.
// Map 2 gives it a live copy on s1 (a snapshot s0 takes as the map takes effect there, then every
// update forwarded); once the copy has caught up, map 3 makes s1 its primary. The workers only
// refresh their map; nobody stops. Gradients are small integers and SGD's rate 0.5, so the
// final weights show exactly how many times each push landed, whatever the order.
TEST(ShardMoveTest, AShardMovesWhileTwoWorkersTrainAndEveryPushLandsOnce) {
  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  for (int i = 0; i < 2; ++i) cluster.server(i)->handler()->set_node_id("s" + std::to_string(i));
  auto w = DenseSpec("w", {64, 500}, kSgd, 500);
  constexpr int kSteps = 400;
  constexpr size_t kElems = 32000;
  absl::Mutex map_mu;
  v1::ShardMap current = cluster.Map("job", 1);
  PsClientOptions opts;
  opts.call_timeout = absl::Seconds(30);
  opts.refresh_shard_map = [&]() -> absl::StatusOr<v1::ShardMap> {
    absl::MutexLock l(&map_mu);
    return current;
  };
  std::unique_ptr<PsClient> clients[2];
  for (uint32_t r = 0; r < 2; ++r) {
    auto c = cluster.Client("job", {w}, r, opts);
    ASSERT_TRUE(c.ok()) << c.status();
    clients[r] = std::move(*c);
  }
  ASSERT_TRUE(clients[0]->CreateTables(Mode(v1::ConsistencySpec::BSP), 2).ok());
  auto grad = [](int step, int rank) { return static_cast<float>(1 + (step + rank) % 3); };
  std::atomic<int> done[2] = {0, 0};
  absl::Status result[2];
  std::vector<std::thread> workers;
  for (int r = 0; r < 2; ++r) {
    workers.emplace_back([&, r] {
      std::vector<float> g(kElems), got(kElems);
      for (int step = 0; step < kSteps; ++step) {
        std::fill(g.begin(), g.end(), grad(step, r));
        absl::Status st = clients[r]->PushPull(step, {{{"w", g.data()}}, {}},
                                               {{{"w", got.data()}}, {}});
        if (!st.ok()) {
          result[r] = st;
          return;
        }
        done[r] = step + 1;
      }
    });
  }
  auto wait_for = [&](int steps) {
    const absl::Time until = absl::Now() + absl::Seconds(60);
    while ((done[0] < steps || done[1] < steps) && absl::Now() < until && result[0].ok() &&
           result[1].ok()) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  };
  auto update = [&](int server, const v1::ShardMap& map, bool seed_backups, bool live_copy) {
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = map;
    req.set_self("s" + std::to_string(server));
    req.set_seed_new_backups(seed_backups);
    if (live_copy) {
      v1::ReplicaSeed* seed = req.add_copy_from();
      seed->set_primary("s0");
      seed->set_live(true);
    }
    v1::UpdateShardMapResponse resp;
    return cluster.server(server)->handler()->UpdateShardMap(req, &resp);
  };
  auto publish = [&](const v1::ShardMap& map) {
    absl::MutexLock l(&map_mu);
    current = map;
  };
  wait_for(20);

  // Map 2: s1 takes a live copy of shard 0 (the target first, so it waits for the snapshot).
  v1::ShardMap map2 = current;
  map2.set_epoch(2);
  map2.mutable_assignments(0)->add_backups("s1");
  publish(map2);
  ASSERT_TRUE(update(1, map2, false, true).ok());
  ASSERT_TRUE(update(0, map2, true, false).ok());
  const int copied_at = std::min(done[0].load(), done[1].load());
  v1::ReplicaOnServer copy;
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (absl::Now() < until) {
    v1::ServerStatusRequest sreq;
    v1::ServerStatus st;
    ASSERT_TRUE(cluster.server(1)->handler()->Status(sreq, &st).ok());
    ASSERT_EQ(st.jobs(0).replicas_size(), 1);
    copy = st.jobs(0).replicas(0);
    if (copy.caught_up()) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(copy.seeded());
  ASSERT_TRUE(copy.caught_up());
  EXPECT_EQ(copy.primary(), "s0");
  ASSERT_EQ(copy.shards_size(), 1);
  EXPECT_EQ(copy.shards(0), 0u);

  // Map 3: s1 is shard 0's primary (the old primary first: it hands over what it applied).
  v1::ShardMap map3 = map2;
  map3.set_epoch(3);
  map3.mutable_assignments(0)->set_primary("s1");
  map3.mutable_assignments(0)->clear_backups();
  publish(map3);
  ASSERT_TRUE(update(0, map3, false, false).ok());
  ASSERT_TRUE(update(1, map3, false, false).ok());
  const int switched_at = std::min(done[0].load(), done[1].load());
  for (auto& t : workers) t.join();
  ASSERT_TRUE(result[0].ok()) << result[0];
  ASSERT_TRUE(result[1].ok()) << result[1];
  EXPECT_GT(copied_at, 0);
  EXPECT_LT(switched_at, kSteps) << "the move is meant to happen while the workers train";

  auto statuses = clients[0]->ServerStatuses();
  ASSERT_TRUE(statuses.ok());
  ASSERT_EQ(statuses->size(), 2u);
  for (const v1::ServerStatus& st : *statuses) {
    const auto& shards = st.jobs(0).shards();
    const bool holds0 = std::find(shards.begin(), shards.end(), 0u) != shards.end();
    EXPECT_EQ(holds0, st.node_id() == "s1") << st.node_id();
    EXPECT_EQ(st.jobs(0).replicas_size(), 0) << st.node_id();
    EXPECT_EQ(st.jobs(0).min_clock(), kSteps) << st.node_id();
  }
  float sum = 0;
  for (int step = 0; step < kSteps; ++step) sum += grad(step, 0) + grad(step, 1);
  std::vector<float> got(kElems);
  ASSERT_TRUE(clients[0]->Pull(kSteps, {{{"w", got.data()}}, {}}).ok());
  const auto w0 = InitialDense(w, kElems);
  for (size_t i = 0; i < kElems; ++i) {
    ASSERT_NEAR(got[i], w0[i] - 0.5f * sum, 1e-3) << "element " << i << " (block " << i / 500
                                                 << ")";
  }
}

// A live copy applies no update before its snapshot (one that arrives first was queued before
// the snapshot, which holds it: acknowledged as a duplicate), cannot take over before it either,
// and refuses snapshot parts that do not fit.
TEST(ShardMoveTest, ALiveCopyAppliesNothingThatComesBeforeItsSnapshot) {
  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  for (int i = 0; i < 2; ++i) cluster.server(i)->handler()->set_node_id("s" + std::to_string(i));
  auto w = DenseSpec("w", {64, 500}, kSgd, 500);
  auto client = cluster.Client("job", {w});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTables(Mode(v1::ConsistencySpec::BSP), 1).ok());
  PsHandler* target = cluster.server(1)->handler();
  v1::ShardMap map2 = cluster.Map("job", 2);
  map2.mutable_assignments(0)->add_backups("s1");
  v1::UpdateShardMapRequest req;
  *req.mutable_map() = map2;
  req.set_self("s1");
  v1::ReplicaSeed* seed = req.add_copy_from();
  seed->set_primary("s0");
  seed->set_live(true);
  v1::UpdateShardMapResponse resp;
  ASSERT_TRUE(target->UpdateShardMap(req, &resp).ok());

  v1::ReplicateRequest chunk;
  chunk.set_primary("s0");
  chunk.mutable_chunk()->mutable_tag()->set_job_id("job");
  chunk.mutable_chunk()->mutable_tag()->set_step(0);
  chunk.mutable_chunk()->mutable_slice()->set_table("w");
  chunk.mutable_chunk()->set_values(std::string(2000, '\0'));
  v1::ReplicateResponse rr;
  absl::Status st = target->Replicate(chunk, &rr);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_TRUE(rr.duplicate());
  {
    // Still a copy waiting for its snapshot.
    v1::ServerStatusRequest sreq;
    sreq.set_job_id("job");
    v1::ServerStatus sresp;
    ASSERT_TRUE(target->Status(sreq, &sresp).ok());
    ASSERT_EQ(sresp.jobs_size(), 1);
    ASSERT_EQ(sresp.jobs(0).replicas_size(), 1);
    EXPECT_EQ(sresp.jobs(0).replicas(0).primary(), "s0");
    EXPECT_FALSE(sresp.jobs(0).replicas(0).seeded());
  }

  v1::ReplicateRequest part;
  part.set_primary("s0");
  part.mutable_chunk()->mutable_tag()->set_job_id("job");
  part.set_seed("abcd");
  part.set_seed_offset(8);
  part.set_seed_size(10);
  st = target->Replicate(part, &rr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  part.set_seed_offset(4);
  part.set_seed_size(100);
  st = target->Replicate(part, &rr);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("before the part at 0"), std::string::npos) << st;
  // A whole "snapshot" that is not a checkpoint is refused, naming it, and loads nothing.
  part.set_seed(std::string(100, 'x'));
  part.set_seed_offset(0);
  st = target->Replicate(part, &rr);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("snapshot of s0's shards"), std::string::npos) << st;

  v1::ShardMap map3 = map2;
  map3.set_epoch(3);
  map3.mutable_assignments(0)->set_primary("s1");
  map3.mutable_assignments(0)->clear_backups();
  *req.mutable_map() = map3;
  req.clear_copy_from();
  st = target->UpdateShardMap(req, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("has not received its snapshot"), std::string::npos) << st;
  v1::ServerStatus status;
  ASSERT_TRUE(target->Status(v1::ServerStatusRequest(), &status).ok());
  EXPECT_EQ(status.jobs(0).epoch(), 2u) << "the refused map changed nothing";
  ASSERT_EQ(status.jobs(0).replicas_size(), 1);
  EXPECT_FALSE(status.jobs(0).replicas(0).seeded());
  EXPECT_FALSE(status.jobs(0).replicas(0).caught_up());
}

TEST(ReplicationTest, APushIsNotAcknowledgedUntilItsBackupHasIt) {
  PsServerOptions so;
  so.replication_retry = absl::Milliseconds(300);
  InProcessCluster cluster(1, so);
  ASSERT_TRUE(cluster.status().ok());
  cluster.server(0)->handler()->set_node_id("s0");
  v1::ShardMap map = RoundRobinMap("job", 1, cluster.addresses());
  for (auto& a : *map.mutable_assignments()) a.add_backups("s9");
  auto* gone = map.add_servers();
  gone->set_node_id("s9");
  gone->set_address("127.0.0.1:1");  // Nothing listens there.
  auto w = DenseSpec("w", {2, 500}, kSgd, 500);
  PsClientOptions opts;
  opts.job_id = "job";
  opts.call_timeout = absl::Seconds(2);
  // The client routes by primaries only: s0 (its map leaves the backup out, so that the only
  // error it can meet is the primary's).
  auto client = PsClient::Create(opts, RoundRobinMap("job", 1, cluster.addresses()), {w});
  ASSERT_TRUE(client.ok());
  v1::UpdateShardMapRequest req;
  *req.mutable_map() = map;
  req.set_self("s0");
  v1::UpdateShardMapResponse resp;
  ASSERT_TRUE(cluster.server(0)->handler()->UpdateShardMap(req, &resp).ok());
  v1::CreateTablesRequest ct;
  ct.set_job_id("job");
  *ct.add_tables() = w;
  *ct.mutable_consistency() = Mode(v1::ConsistencySpec::ASP);
  ct.set_num_workers(1);
  v1::CreateTablesResponse ctr;
  ASSERT_TRUE(cluster.server(0)->handler()->CreateTables(ct, &ctr).ok());
  std::vector<float> g(1000, 1.f);
  absl::Status st = (*client)->Push(0, {{{"w", g.data()}}, {}});
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("replicating to the backup at 127.0.0.1:1"), std::string::npos)
      << st;
  // Until a newer map drops the backup, every push fails the same way.
  st = (*client)->Push(1, {{{"w", g.data()}}, {}});
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("replicating to the backup at 127.0.0.1:1"), std::string::npos)
      << st;
  // Status names the backup it cannot reach (the scheduler drops it from the map on that).
  v1::ServerStatus status;
  ASSERT_TRUE(cluster.server(0)->handler()->Status(v1::ServerStatusRequest(), &status).ok());
  ASSERT_EQ(status.jobs_size(), 1);
  ASSERT_EQ(status.jobs(0).unreachable_backups_size(), 1);
  EXPECT_EQ(status.jobs(0).unreachable_backups(0), "127.0.0.1:1");
  // The map without it: the push goes through, and the server reports nothing unreachable.
  v1::ShardMap without = RoundRobinMap("job", 1, cluster.addresses());
  without.set_epoch(map.epoch() + 1);
  *req.mutable_map() = without;
  ASSERT_TRUE(cluster.server(0)->handler()->UpdateShardMap(req, &resp).ok());
  ASSERT_TRUE((*client)->SetShardMap(without).ok());
  st = (*client)->Push(1, {{{"w", g.data()}}, {}});
  EXPECT_TRUE(st.ok()) << st;
  status.Clear();
  ASSERT_TRUE(cluster.server(0)->handler()->Status(v1::ServerStatusRequest(), &status).ok());
  EXPECT_EQ(status.jobs(0).unreachable_backups_size(), 0);
}

}  // namespace
}  // namespace pscluster
