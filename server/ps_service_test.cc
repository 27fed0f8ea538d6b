// In-process tier: real ps_server instances on loopback port 0, driven through the client
// library and through the generated gRPC stubs.
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

std::vector<float> InitialDense(const v1::TableSpec& spec, uint64_t n) {
  std::vector<float> v(n);
  Initializer(spec).FillDense(0, n, v.data());
  return v;
}

std::vector<float> InitialRows(const v1::TableSpec& spec, const std::vector<uint64_t>& keys) {
  std::vector<float> v(keys.size() * spec.row_width());
  Initializer init(spec);
  for (size_t i = 0; i < keys.size(); ++i) {
    init.FillRow(keys[i], spec.row_width(), v.data() + i * spec.row_width());
  }
  return v;
}

// (servers, transport of the client's data plane)
class ServiceTest : public ::testing::TestWithParam<std::tuple<int, DataTransport>> {};

TEST_P(ServiceTest, PushesAndPullsDenseAndSparseThroughTheClient) {
  InProcessCluster cluster(std::get<0>(GetParam()));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  // 10 blocks of 1000 plus a short one; a sparse table with a key space.
  auto w = DenseSpec("fc/w", {10, 1050}, kSgd, 1000);
  auto e = SparseSpec("emb", 16, 1u << 30, kSgd);
  PsClientOptions options;
  options.data_transport = std::get<1>(GetParam());
  auto client = cluster.Client("job", {w, e}, 0, options);
  ASSERT_TRUE(client.ok()) << client.status();
  v1::ConsistencySpec asp;
  asp.set_mode(v1::ConsistencySpec::ASP);
  ASSERT_TRUE((*client)->CreateTables(asp, 1).ok());
  ASSERT_TRUE((*client)->CreateTables(asp, 1).ok()) << "idempotent";

  std::vector<float> wv(10500, -1.f);
  std::vector<uint64_t> keys = {5, 1u << 29, 77, 5, 123456789};
  std::vector<float> rows(keys.size() * 16, -1.f);
  PullTargets targets{{{"fc/w", wv.data()}}, {{"emb", keys, rows.data()}}};
  ASSERT_TRUE((*client)->Pull(0, targets).ok());
  EXPECT_EQ(wv, InitialDense(w, 10500));
  EXPECT_EQ(rows, InitialRows(e, keys));

  std::vector<float> g(10500);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 7);
  std::vector<float> eg(keys.size() * 16, 1.f);
  PushSources sources{{{"fc/w", g.data()}}, {{"emb", keys, eg.data()}}};
  ASSERT_TRUE((*client)->Push(0, sources).ok());
  ASSERT_TRUE((*client)->Pull(1, targets).ok());
  auto w0 = InitialDense(w, 10500);
  for (size_t i = 0; i < wv.size(); ++i) ASSERT_FLOAT_EQ(wv[i], w0[i] - 0.5f * g[i]) << i;
  auto r0 = InitialRows(e, keys);
  for (size_t i = 0; i < rows.size(); ++i) {
    float times = keys[i / 16] == 5 ? 2.f : 1.f;  // Key 5 twice: its gradients add.
    ASSERT_FLOAT_EQ(rows[i], r0[i] - 0.5f * times) << i;
  }
  // PushPull: the reply reflects this push.
  ASSERT_TRUE((*client)->PushPull(1, sources, targets).ok());
  for (size_t i = 0; i < wv.size(); ++i) ASSERT_FLOAT_EQ(wv[i], w0[i] - 1.0f * g[i]) << i;

  auto statuses = (*client)->ServerStatuses();
  ASSERT_TRUE(statuses.ok());
  uint64_t blocks = 0;
  for (const auto& s : *statuses) {
    ASSERT_EQ(s.jobs_size(), 1);
    EXPECT_EQ(s.jobs(0).clocks(0).clock(), 2) << "every server saw both steps end";
    for (const auto& t : s.jobs(0).tables()) {
      if (t.name() == "fc/w") blocks += t.rows();
    }
  }
  EXPECT_EQ(blocks, 11u);
}

INSTANTIATE_TEST_SUITE_P(ServersAndTransports, ServiceTest,
                         ::testing::Combine(::testing::Values(1, 2),
                                            ::testing::Values(DataTransport::kTcp,
                                                              DataTransport::kGrpc)));

v1::ConsistencySpec Mode(v1::ConsistencySpec::Mode mode, uint32_t staleness = 0) {
  v1::ConsistencySpec c;
  c.set_mode(mode);
  c.set_staleness(staleness);
  return c;
}

// The data plane speaks plain protobuf: the generated stubs work against it.
TEST(ServiceInteropTest, GeneratedStubsPullPushAndPushPull) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok());
  auto w = DenseSpec("w", {3000}, kSgd, 1000);
  auto client = cluster.Client("job", {w});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTables(Mode(v1::ConsistencySpec::ASP), 1).ok());
  auto channel = *MakeChannel(cluster.addresses()[0]);
  auto stub = v1::ParameterServer::NewStub(channel);
  const auto w0 = InitialDense(w, 3000);

  // Pull: one request, one chunk per block; `last` on the final one.
  v1::PullRequest pr;
  pr.set_request_id(42);
  pr.set_job_id("job");
  pr.set_epoch(1);
  for (int b : {2, 0}) {
    auto* sl = pr.add_slices();
    sl->set_table("w");
    sl->set_block(b);
  }
  {
    auto ctx = CallContext(absl::Seconds(10));
    auto reader = stub->Pull(ctx.get(), pr);
    v1::PullChunk chunk;
    std::vector<v1::PullChunk> got;
    while (reader->Read(&chunk)) got.push_back(chunk);
    ASSERT_TRUE(reader->Finish().ok());
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].request_id(), 42u);
    EXPECT_EQ(got[0].index(), 0u);
    EXPECT_EQ(got[1].index(), 1u);
    EXPECT_FALSE(got[0].last());
    EXPECT_TRUE(got[1].last());
    ASSERT_EQ(got[0].values().size(), 4000u);
    EXPECT_EQ(std::memcmp(got[0].values().data(), w0.data() + 2000, 4000), 0);
    EXPECT_EQ(std::memcmp(got[1].values().data(), w0.data(), 4000), 0);
  }

  // Push: a client stream, one acknowledgement; a replay is acknowledged as duplicates.
  auto push = [&](v1::PushResponse* resp) {
    auto ctx = CallContext(absl::Seconds(10));
    auto writer = stub->Push(ctx.get(), resp);
    for (int b = 0; b < 3; ++b) {
      v1::PushChunk c;
      c.set_request_id(7);
      c.mutable_tag()->set_job_id("job");
      c.mutable_tag()->set_step(0);
      c.set_epoch(1);
      c.mutable_slice()->set_table("w");
      c.mutable_slice()->set_block(b);
      c.set_values(std::string(4000, '\0'));
      std::vector<float> g(1000, 1.f + b);
      std::memcpy(c.mutable_values()->data(), g.data(), 4000);
      c.set_last(b == 2);
      c.set_end_of_step(b == 2);
      EXPECT_TRUE(writer->Write(c));
    }
    writer->WritesDone();
    return writer->Finish();
  };
  v1::PushResponse resp;
  ASSERT_TRUE(push(&resp).ok());
  EXPECT_EQ(resp.request_id(), 7u);
  EXPECT_EQ(resp.applied(), 3u);
  EXPECT_EQ(resp.duplicates(), 0u);
  EXPECT_EQ(resp.clock(), 1);
  ASSERT_TRUE(push(&resp).ok());
  EXPECT_EQ(resp.applied(), 0u);
  EXPECT_EQ(resp.duplicates(), 3u);

  // PushPull: the reply carries the slice after this push's update.
  {
    auto ctx = CallContext(absl::Seconds(10));
    auto rw = stub->PushPull(ctx.get());
    v1::PushChunk c;
    c.set_request_id(9);
    c.mutable_tag()->set_job_id("job");
    c.mutable_tag()->set_step(1);
    c.set_epoch(1);
    c.mutable_slice()->set_table("w");
    c.mutable_slice()->set_block(1);
    std::vector<float> g(1000, 2.f);
    c.set_values(std::string(reinterpret_cast<char*>(g.data()), 4000));
    c.set_pull_after(true);
    c.set_pull_clock(2);
    c.set_last(true);
    c.set_end_of_step(true);
    ASSERT_TRUE(rw->Write(c));
    rw->WritesDone();
    v1::PullChunk reply;
    ASSERT_TRUE(rw->Read(&reply));
    EXPECT_TRUE(reply.last());
    EXPECT_EQ(reply.request_id(), 9u);
    std::vector<float> v(1000);
    ASSERT_EQ(reply.values().size(), 4000u);
    std::memcpy(v.data(), reply.values().data(), 4000);
    for (int i = 0; i < 1000; ++i) ASSERT_FLOAT_EQ(v[i], w0[1000 + i] - 0.5f * 2 - 0.5f * 2);
    EXPECT_FALSE(rw->Read(&reply));
    ASSERT_TRUE(rw->Finish().ok());
  }
}

// A server refuses a stale epoch; the client refreshes its map and retries with the same tags,
// so the chunks the first attempt did apply are not applied again.
TEST(ServiceEpochTest, StaleEpochRefreshesTheMapAndRetriesExactlyOnce) {
  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  auto w = DenseSpec("w", {64, 500}, kSgd, 500);
  std::atomic<int> refreshes{0};
  PsClientOptions opts;
  auto bump = [&](int server) {
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = cluster.Map("job", 2);
    req.set_self("s" + std::to_string(server));
    v1::UpdateShardMapResponse resp;
    return cluster.server(server)->handler()->UpdateShardMap(req, &resp);
  };
  opts.refresh_shard_map = [&]() -> absl::StatusOr<v1::ShardMap> {
    ++refreshes;
    absl::Status st = bump(0);  // The scheduler reaches server 0 too.
    if (!st.ok()) return st;
    return cluster.Map("job", 2);
  };
  auto client = cluster.Client("job", {w}, 0, opts);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTables(Mode(v1::ConsistencySpec::ASP), 1).ok());
  ASSERT_TRUE(bump(1).ok());  // Server 1 moves to epoch 2 first.
  std::vector<float> g(32000, 1.f);
  ASSERT_TRUE((*client)->Push(0, {{{"w", g.data()}}, {}}).ok());
  EXPECT_EQ(refreshes.load(), 1);
  EXPECT_EQ((*client)->shard_map().epoch(), 2u);
  std::vector<float> v(32000);
  ASSERT_TRUE((*client)->Pull(1, {{{"w", v.data()}}, {}}).ok());
  const auto w0 = InitialDense(w, 32000);
  for (size_t i = 0; i < v.size(); ++i) ASSERT_FLOAT_EQ(v[i], w0[i] - 0.5f) << i;
  auto st = (*client)->ServerStatuses();
  ASSERT_TRUE(st.ok());
  EXPECT_GT((*st)[0].duplicates_total(), 0u) << "server 0 saw the retried chunks again";
  EXPECT_EQ((*st)[1].duplicates_total(), 0u);
}

// A server that restarted has lost the job. Under a scheduler the client waits that out like an
// unreachable server (the scheduler recovers the job, or stops the task); standalone, the
// caller gets the server's NOT_FOUND at once.
TEST(ServiceEpochTest, AServerThatLostTheJobIsWaitedOutUnderAScheduler) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok());
  auto w = DenseSpec("w", {1000}, kSgd, 500);
  PsClientOptions opts;
  opts.refresh_shard_map = [&]() -> absl::StatusOr<v1::ShardMap> { return cluster.Map("job", 1); };
  auto managed = cluster.Client("job", {w}, 0, opts);
  ASSERT_TRUE(managed.ok());
  auto standalone = cluster.Client("job", {w}, 0);
  ASSERT_TRUE(standalone.ok());
  ASSERT_TRUE((*managed)->CreateTables(Mode(v1::ConsistencySpec::ASP), 1).ok());
  std::vector<float> g(1000, 1.f);
  ASSERT_TRUE((*managed)->Push(0, {{{"w", g.data()}}, {}}).ok());

  ASSERT_TRUE((*managed)->DropJob().ok());  // As if the server had restarted.
  absl::Status st = (*standalone)->Push(1, {{{"w", g.data()}}, {}});
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("unknown job 'job'"), std::string::npos) << st;

  // The job comes back (here: its tables created again) while the managed client waits.
  std::thread back([&] {
    absl::SleepFor(absl::Milliseconds(300));
    auto again = cluster.Client("job", {w}, 0);
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE((*again)->CreateTables(Mode(v1::ConsistencySpec::ASP), 1).ok());
  });
  const absl::Time t0 = absl::Now();
  st = (*managed)->Push(1, {{{"w", g.data()}}, {}});
  back.join();
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(250));

  // Waiting ends when the task is stopped.
  ASSERT_TRUE((*managed)->DropJob().ok());
  std::thread stop([&] {
    absl::SleepFor(absl::Milliseconds(200));
    (*managed)->Cancel();
  });
  st = (*managed)->Push(2, {{{"w", g.data()}}, {}});
  stop.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
}

// A task whose rank the scheduler handed to a newer task (FenceWorker on the servers) gets
// ABORTED at once on every transport, with no retry and no wait, even with a map-refresh
// callback (under a scheduler); the newer task carries on from where the fence left the rank.
class FencingTest : public ::testing::TestWithParam<DataTransport> {};

TEST_P(FencingTest, AFencedTaskIsRefusedAtOnceAndItsReplacementCarriesOn) {
  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  auto w = DenseSpec("w", {8, 500}, kSgd, 500);
  PsClientOptions opts;
  opts.data_transport = GetParam();
  opts.refresh_shard_map = [&]() -> absl::StatusOr<v1::ShardMap> { return cluster.Map("job", 1); };
  opts.attempt = 3;
  auto old_task = cluster.Client("job", {w}, 0, opts);
  ASSERT_TRUE(old_task.ok());
  ASSERT_TRUE((*old_task)->CreateTables(Mode(v1::ConsistencySpec::BSP), 1).ok());
  std::vector<float> w0(4000), g(4000, 1.f), got(4000);
  PullTargets targets{{{"w", w0.data()}}, {}};
  ASSERT_TRUE((*old_task)->Pull(0, targets).ok());
  PushSources src{{{"w", g.data()}}, {}};
  ASSERT_TRUE((*old_task)->Push(0, src).ok());

  for (int i = 0; i < 2; ++i) {
    v1::FenceWorkerRequest req;
    req.set_job_id("job");
    req.set_worker(0);
    req.set_attempt(4);
    v1::FenceWorkerResponse resp;
    ASSERT_TRUE(cluster.server(i)->handler()->FenceWorker(req, &resp).ok());
    EXPECT_EQ(resp.clock(), 1);
  }
  const absl::Time t0 = absl::Now();
  absl::Status st = (*old_task)->Push(1, src);
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_NE(st.message().find("rank 0 of job 'job' was handed to a newer task (attempt 4); this "
                              "task (attempt 3) was replaced"),
            std::string::npos)
      << st;
  PullTargets old_targets{{{"w", got.data()}}, {}};
  EXPECT_EQ((*old_task)->PushPull(1, src, old_targets).code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*old_task)->Pull(1, old_targets).code(), absl::StatusCode::kAborted);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5)) << "refused calls are not retried";
  EXPECT_EQ((*old_task)->stats().retries, 0u);

  opts.attempt = 4;
  auto new_task = cluster.Client("job", {w}, 0, opts);
  ASSERT_TRUE(new_task.ok());
  PullTargets new_targets{{{"w", got.data()}}, {}};
  ASSERT_TRUE((*new_task)->Pull(1, new_targets).ok());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_FLOAT_EQ(got[i], w0[i] - 0.5f) << i;
  ASSERT_TRUE((*new_task)->PushPull(1, src, new_targets).ok());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_FLOAT_EQ(got[i], w0[i] - 1.0f) << i;
}

INSTANTIATE_TEST_SUITE_P(Transports, FencingTest,
                         ::testing::Values(DataTransport::kTcp, DataTransport::kGrpc,
                                           DataTransport::kUnix));

// Replication: with a backup for every shard on the other server, each primary forwards what it
// applies before it acknowledges it, so the backup's copy is bit for bit the primary's. When a
// server is lost, a map that makes the backup the primary (PromoteBackups) hands the copy over:
// a worker that resumes at its lowest clock re-pushes a half-done step, and every chunk lands
// exactly once.
v1::ShardMap ReplicatedMap(const std::string& job, uint64_t epoch,
                           const std::vector<std::string>& addresses) {
  v1::ShardMap m = RoundRobinMap(job, epoch, addresses);
  for (auto& a : *m.mutable_assignments()) {
    a.add_backups(a.primary() == "s0" ? "s1" : "s0");
  }
  return m;
}

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

// A live copy takes no update before its snapshot, cannot take over before it either, and
// refuses snapshot parts that do not fit.
TEST(ShardMoveTest, ALiveCopyRefusesWhatComesBeforeItsSnapshot) {
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
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("waiting for its snapshot"), std::string::npos) << st;

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

// A push that fails after one server applied its part, retried by the caller once the map is
// current, is applied exactly once everywhere.
TEST(ServiceEpochTest, CallerRetryOfAFailedPushReusesItsTags) {
  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  auto w = DenseSpec("w", {64, 500}, kSgd, 500);
  auto client = cluster.Client("job", {w});  // No refresh callback: errors reach the caller.
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTables(Mode(v1::ConsistencySpec::ASP), 1).ok());
  v1::UpdateShardMapRequest req;
  *req.mutable_map() = cluster.Map("job", 2);
  req.set_self("s1");
  v1::UpdateShardMapResponse resp;
  ASSERT_TRUE(cluster.server(1)->handler()->UpdateShardMap(req, &resp).ok());
  std::vector<float> g(32000, 1.f);
  PushSources src{{{"w", g.data()}}, {}};
  absl::Status st = (*client)->Push(0, src, /*end_of_step=*/false);
  ASSERT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  req.set_self("s0");
  ASSERT_TRUE(cluster.server(0)->handler()->UpdateShardMap(req, &resp).ok());
  ASSERT_TRUE((*client)->SetShardMap(cluster.Map("job", 2)).ok());
  ASSERT_TRUE((*client)->Push(0, src, false).ok());  // The retry.
  ASSERT_TRUE((*client)->Push(0, src).ok());         // A second, distinct push of step 0.
  std::vector<float> v(32000);
  ASSERT_TRUE((*client)->Pull(1, {{{"w", v.data()}}, {}}).ok());
  const auto w0 = InitialDense(w, 32000);
  for (size_t i = 0; i < v.size(); ++i) ASSERT_FLOAT_EQ(v[i], w0[i] - 1.0f) << i;
}

// Many workers push and pull concurrently (ASP); SGD with gradients that add exactly, so the
// final values show every push applied exactly once whatever the interleaving.
TEST(ServiceConcurrencyTest, ConcurrentWorkersAndReadersApplyEveryPushOnce) {
  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  auto w = DenseSpec("w", {40000}, Optimizer(v1::OptimizerSpec::SGD, 1.f), 4096);
  auto e = SparseSpec("e", 8, 0, Optimizer(v1::OptimizerSpec::SGD, 1.f));
  w.mutable_init()->set_kind(v1::InitializerSpec::ZEROS);
  e.mutable_init()->set_kind(v1::InitializerSpec::ZEROS);
  constexpr int kWorkers = 4, kSteps = 40;
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int i = 0; i < kWorkers; ++i) clients.push_back(std::move(*cluster.Client("job", {w, e}, i)));
  ASSERT_TRUE(clients[0]->CreateTables(Mode(v1::ConsistencySpec::ASP), kWorkers).ok());
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    auto c = std::move(*cluster.Client("job", {w, e}, 0));
    std::vector<float> v(40000);
    while (!stop) ASSERT_TRUE(c->Pull(0, {{{"w", v.data()}}, {}}).ok());
  });
  std::vector<std::thread> workers;
  for (int i = 0; i < kWorkers; ++i) {
    workers.emplace_back([&, i] {
      std::vector<float> g(40000, 1.f / 1024), v(40000);
      std::vector<uint64_t> keys = {1, 2, 3, static_cast<uint64_t>(100 + i)};
      std::vector<float> eg(keys.size() * 8, 1.f / 256), rows(keys.size() * 8);
      for (int s = 0; s < kSteps; ++s) {
        ASSERT_TRUE(clients[i]
                        ->PushPull(s, {{{"w", g.data()}}, {{"e", keys, eg.data()}}},
                                   {{{"w", v.data()}}, {{"e", keys, rows.data()}}})
                        .ok());
      }
    });
  }
  for (auto& t : workers) t.join();
  stop = true;
  reader.join();
  std::vector<float> v(40000);
  std::vector<uint64_t> keys = {1, 100, 103};
  std::vector<float> rows(keys.size() * 8);
  ASSERT_TRUE(clients[0]->Pull(kSteps, {{{"w", v.data()}}, {{"e", keys, rows.data()}}}).ok());
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(v[i], -1.f / 1024 * kWorkers * kSteps) << i;
  }
  EXPECT_EQ(rows[0], -1.f / 256 * kWorkers * kSteps);
  EXPECT_EQ(rows[8], -1.f / 256 * kSteps);
  EXPECT_EQ(rows[16], -1.f / 256 * kSteps);
}

std::string HttpGet(const std::string& address, const std::string& path) {
  size_t colon = address.rfind(':');
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(std::stoi(address.substr(colon + 1)));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return "";
  std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

TEST(ServiceMetricsTest, ServesPrometheusText) {
  PsServerOptions o;
  o.metrics_listen = "127.0.0.1:0";
  InProcessCluster cluster(1, o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto w = DenseSpec("w", {100}, kSgd);
  auto client = cluster.Client("job", {w});
  ASSERT_TRUE((*client)->CreateTables(Mode(v1::ConsistencySpec::ASP), 1).ok());
  std::vector<float> g(100, 1.f);
  ASSERT_TRUE((*client)->Push(0, {{{"w", g.data()}}, {}}).ok());
  const std::string addr = cluster.server(0)->metrics_address();
  ASSERT_FALSE(addr.empty());
  std::string page = HttpGet(addr, "/metrics");
  EXPECT_NE(page.find("200 OK"), std::string::npos) << page;
  EXPECT_NE(page.find("# TYPE pscluster_server_push_chunks_total counter"), std::string::npos);
  EXPECT_NE(page.find("pscluster_server_push_chunks_total 1\n"), std::string::npos) << page;
  EXPECT_NE(page.find("# TYPE pscluster_server_copies_on_write_total counter"), std::string::npos);
  // The client runs in this process, so it reaches the server through the Unix socket with
  // shared memory (its 400-byte push went inline).
  EXPECT_NE(page.find("pscluster_server_data_connections{transport=\"shm\"} 1\n"),
            std::string::npos) << page;
  EXPECT_NE(page.find("pscluster_server_data_connections{transport=\"tcp\"} 0\n"),
            std::string::npos) << page;
  EXPECT_NE(page.find("pscluster_server_shm_payload_bytes_total{direction=\"received\"} 0\n"),
            std::string::npos) << page;
  EXPECT_NE(page.find("pscluster_job_worker_clock{job=\"job\",worker=\"0\"} 1\n"),
            std::string::npos) << page;
  EXPECT_NE(page.find("pscluster_table_bytes{job=\"job\",table=\"w\"} 400\n"),
            std::string::npos) << page;
  // The control RPCs' latency by method: CreateTables went over gRPC once.
  EXPECT_NE(page.find("pscluster_server_rpc_seconds_count{method=\"CreateTables\"} 1\n"),
            std::string::npos) << page;
  // Latency histograms by phase: the one push chunk was applied once; nothing was read yet.
  EXPECT_NE(page.find("# TYPE pscluster_server_phase_seconds histogram\n"), std::string::npos);
  EXPECT_NE(page.find("pscluster_server_phase_seconds_count{phase=\"apply\"} 1\n"),
            std::string::npos) << page;
  EXPECT_NE(page.find("pscluster_server_phase_seconds_bucket{phase=\"apply\",le=\"+Inf\"} 1\n"),
            std::string::npos) << page;
  EXPECT_NE(page.find("pscluster_server_phase_seconds_count{phase=\"read\"} 0\n"),
            std::string::npos) << page;
  std::vector<float> v(100);
  ASSERT_TRUE((*client)->Pull(1, {{{"w", v.data()}}, {}}).ok());
  page = HttpGet(addr, "/metrics");
  EXPECT_NE(page.find("pscluster_server_phase_seconds_count{phase=\"read\"} 1\n"),
            std::string::npos) << page;
  EXPECT_NE(HttpGet(addr, "/other").find("404"), std::string::npos);
}

TEST(ServiceCompressionTest, Float16AndBFloat16TransportPerTable) {
  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  auto h = DenseSpec("half", {5000}, kSgd, 1000);
  h.mutable_compression()->set_transport(v1::DT_FLOAT16);
  auto b = SparseSpec("bf", 32, 0, kSgd);
  b.mutable_compression()->set_transport(v1::DT_BFLOAT16);
  auto client = cluster.Client("job", {h, b});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTables(Mode(v1::ConsistencySpec::ASP), 1).ok());
  std::vector<float> hv(5000), hg(5000, 0.25f);
  std::vector<uint64_t> keys = {1, 2, 3, 1000000};
  std::vector<float> rows(keys.size() * 32), rg(keys.size() * 32, 0.5f);
  ASSERT_TRUE((*client)->PushPull(0, {{{"half", hg.data()}}, {{"bf", keys, rg.data()}}},
                                  {{{"half", hv.data()}}, {{"bf", keys, rows.data()}}})
                  .ok());
  const auto h0 = InitialDense(h, 5000);
  for (size_t i = 0; i < hv.size(); ++i) ASSERT_NEAR(hv[i], h0[i] - 0.125f, 1e-3) << i;
  const auto r0 = InitialRows(b, keys);
  for (size_t i = 0; i < rows.size(); ++i) ASSERT_NEAR(rows[i], r0[i] - 0.25f, 4e-3) << i;
  auto st = (*client)->ServerStatuses();
  uint64_t in = 0;
  for (const auto& s : *st) in += s.bytes_in_total();
  EXPECT_EQ(in, 5000u * 2 + keys.size() * 32 * 2) << "2 bytes per element on the wire";
}

// Parked pulls hold no thread: with a single data thread, 24 pulls waiting for a slow worker do
// not stop another job from being served.
TEST(ServiceConsistencyTest, ParkedPullsHoldNoThread) {
  PsServerOptions o;
  o.data_threads = 1;
  InProcessCluster cluster(1, o);
  ASSERT_TRUE(cluster.status().ok());
  auto w = DenseSpec("w", {100}, kSgd);
  auto bsp0 = cluster.Client("bsp", {w}, 0);
  auto bsp1 = cluster.Client("bsp", {w}, 1);
  auto other = cluster.Client("asp", {w}, 0);
  ASSERT_TRUE((*bsp0)->CreateTables(Mode(v1::ConsistencySpec::BSP), 2).ok());
  ASSERT_TRUE((*other)->CreateTables(Mode(v1::ConsistencySpec::ASP), 1).ok());
  std::vector<float> g(100, 1.f);
  ASSERT_TRUE((*bsp0)->Push(0, {{{"w", g.data()}}, {}}).ok());
  // Pulls from separate clients (separate streams, as many workers would have).
  constexpr int kPulls = 24;
  std::vector<std::vector<float>> out(kPulls, std::vector<float>(100));
  std::vector<std::unique_ptr<PsClient>> readers;
  for (int i = 0; i < kPulls; ++i) readers.push_back(std::move(*cluster.Client("bsp", {w}, 0)));
  std::vector<std::thread> pulls;
  std::atomic<int> done{0};
  for (int i = 0; i < kPulls; ++i) {
    pulls.emplace_back([&, i] {
      EXPECT_TRUE(readers[i]->Pull(1, {{{"w", out[i].data()}}, {}}).ok());
      EXPECT_EQ(readers[i]->last_min_clock(), 1);
      ++done;
    });
  }
  // Wait until every pull is parked on the server.
  for (int i = 0; i < 500; ++i) {
    auto st = (*bsp0)->ServerStatuses();
    if (st.ok() && (*st)[0].jobs(0).waiting_pulls() == kPulls) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  auto st = (*bsp0)->ServerStatuses();
  ASSERT_EQ((*st)[0].jobs(0).waiting_pulls(), static_cast<uint32_t>(kPulls));
  ASSERT_EQ((*st)[0].jobs(0).waiting_for_size(), 1);
  EXPECT_EQ((*st)[0].jobs(0).waiting_for(0), 1u);
  // The other job is served meanwhile.
  std::vector<float> v(100);
  for (int step = 0; step < 20; ++step) {
    ASSERT_TRUE((*other)->PushPull(step, {{{"w", g.data()}}, {}}, {{{"w", v.data()}}, {}}).ok());
  }
  EXPECT_EQ(done.load(), 0);
  // The slow worker finishes step 0: every parked pull is answered, with the update applied.
  ASSERT_TRUE((*bsp1)->Push(0, {{{"w", g.data()}}, {}}).ok());
  for (auto& t : pulls) t.join();
  const auto w0 = InitialDense(w, 100);
  for (int i = 0; i < kPulls; ++i) ASSERT_FLOAT_EQ(out[i][5], w0[5] - 1.0f);
}

// SSP(s): a pull for clock c returns only once the slowest worker completed step c - s - 1
// (clock >= c - s). The slow worker announces each push before sending it, so at the moment a
// fast pull returns that announcement must already be there.
void RunSlowWorker(v1::ConsistencySpec::Mode mode, uint32_t s, int* max_lead) {
  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  auto w = DenseSpec("w", {2000}, kSgd, 500);
  auto fast = cluster.Client("job", {w}, 0);
  auto slow = cluster.Client("job", {w}, 1);
  ASSERT_TRUE((*fast)->CreateTables(Mode(mode, s), 2).ok());
  constexpr int kSteps = 10;
  std::atomic<int> slow_pushing{-1};  // Step whose push the slow worker has started.
  std::thread slow_thread([&] {
    std::vector<float> v(2000), g(2000, 0.01f);
    for (int c = 0; c < kSteps; ++c) {
      ASSERT_TRUE((*slow)->Pull(c, {{{"w", v.data()}}, {}}).ok());
      absl::SleepFor(absl::Milliseconds(15));
      slow_pushing = c;
      ASSERT_TRUE((*slow)->Push(c, {{{"w", g.data()}}, {}}).ok());
    }
  });
  std::vector<float> v(2000), g(2000, 0.01f);
  *max_lead = 0;
  for (int c = 0; c <= kSteps; ++c) {
    ASSERT_TRUE((*fast)->Pull(c, {{{"w", v.data()}}, {}}).ok());
    const int announced = slow_pushing.load();
    if (mode != v1::ConsistencySpec::ASP) {
      EXPECT_GE(announced, c - static_cast<int>(s) - 1) << "pull at clock " << c;
      EXPECT_GE((*fast)->last_min_clock(), c - static_cast<int64_t>(s)) << "pull at clock " << c;
    }
    *max_lead = std::max(*max_lead, c - (announced + 1));
    if (c < kSteps) {
      ASSERT_TRUE((*fast)->Push(c, {{{"w", g.data()}}, {}}).ok());
    }
  }
  slow_thread.join();
}

TEST(ServiceConsistencyTest, SspBoundHoldsWithADeliberatelySlowWorker) {
  int lead = 0;
  RunSlowWorker(v1::ConsistencySpec::SSP, 2, &lead);
  EXPECT_LE(lead, 3);
  EXPECT_GE(lead, 2) << "the fast worker should run ahead up to the bound";
  RunSlowWorker(v1::ConsistencySpec::BSP, 0, &lead);
  EXPECT_LE(lead, 1);
  // Without a bound the fast worker runs far ahead: the checks above are not vacuous.
  RunSlowWorker(v1::ConsistencySpec::ASP, 0, &lead);
  EXPECT_GT(lead, 5);
}

}  // namespace
}  // namespace pscluster
