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
#include "common/testing/wait_for.h"
#include "server/testing/cluster.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

const v1::OptimizerSpec kSgd = Optimizer(v1::OptimizerSpec::SGD, 0.5f);

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

  // The job comes back (here: its tables created again) once the managed client has been told
  // the job is unknown and is waiting (it retries: its retry count moves).
  auto retries = [&] { return (*managed)->stats().retries; };
  uint64_t before = retries();
  std::thread back([&] {
    ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] { return retries() > before; }));
    auto again = cluster.Client("job", {w}, 0);
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE((*again)->CreateTables(Mode(v1::ConsistencySpec::ASP), 1).ok());
  });
  st = (*managed)->Push(1, {{{"w", g.data()}}, {}});
  back.join();
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_GT(retries(), before);  // It waited for the job instead of failing.

  // Waiting ends when the task is stopped.
  ASSERT_TRUE((*managed)->DropJob().ok());
  before = retries();
  std::thread stop([&] {
    ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] { return retries() > before; }));
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
  EXPECT_NE(page.find("# TYPE pscluster_server_data_connections_refused_total counter"),
            std::string::npos) << page;
  EXPECT_NE(page.find("pscluster_server_data_connections_refused_total{reason=\"auth\"} 0\n"),
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
