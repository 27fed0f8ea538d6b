// The plaintext TCP data plane of ps_server (--data_port): the same results as gRPC PushPull,
// hostile bytes on the port refused without harm, off under TLS and with --data_port=-1, and
// the client's fallback to gRPC.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/status_convert.h"
#include "server/client/tcp_conn.h"
#include "server/shm_ring.h"
#include "server/tcp_frame.h"
#include "server/testing/cluster.h"
#include "server/wire.h"
#include "tests/integration/raw_frames.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

const v1::OptimizerSpec kAdam = Optimizer(v1::OptimizerSpec::ADAM, 0.01f);

v1::ServerStatus StatusOf(const std::string& address, const ChannelOptions& ch = {}) {
  auto channel = MakeChannel(address, ch);
  EXPECT_TRUE(channel.ok()) << channel.status();
  auto stub = v1::ParameterServer::NewStub(*channel);
  v1::ServerStatus resp;
  auto ctx = CallContext(absl::Seconds(5));
  v1::ServerStatusRequest req;
  EXPECT_TRUE(stub->Status(ctx.get(), req, &resp).ok());
  return resp;
}

class TcpDataPlaneTest : public ::testing::Test {
 public:  // The helpers are used by free functions below too.
  // A client of job "job" over `transport`, with `tables` created under `mode` for `workers`
  // workers (nullptr after a test failure).
  static std::unique_ptr<PsClient> ClientWith(InProcessCluster& cluster,
                                              const std::vector<v1::TableSpec>& tables,
                                              DataTransport transport,
                                              v1::ConsistencySpec::Mode mode, uint32_t workers,
                                              absl::Duration timeout = absl::Seconds(20),
                                              size_t shm_ring_bytes = 16 << 20) {
    PsClientOptions o;
    o.data_transport = transport;
    o.call_timeout = timeout;
    o.shm_ring_bytes = shm_ring_bytes;
    auto client = cluster.Client("job", tables, 0, o);
    if (!client.ok()) {
      ADD_FAILURE() << client.status();
      return nullptr;
    }
    v1::ConsistencySpec c;
    c.set_mode(mode);
    absl::Status st = (*client)->CreateTables(c, workers);
    if (!st.ok()) {
      ADD_FAILURE() << st;
      return nullptr;
    }
    return std::move(*client);
  }

  // The same over the TCP data port with one table.
  static std::unique_ptr<PsClient> TcpClient(InProcessCluster& cluster,
                                             const v1::TableSpec& table,
                                             v1::ConsistencySpec::Mode mode, uint32_t workers,
                                             absl::Duration timeout = absl::Seconds(20)) {
    return ClientWith(cluster, {table}, DataTransport::kTcp, mode, workers, timeout);
  }

  // A client of job "job" with the default transport (auto) creates `table` (ASP, 1 worker) and
  // pulls it.
  static void AutoClientPulls(InProcessCluster& cluster, const v1::TableSpec& table) {
    v1::ConsistencySpec asp;
    asp.set_mode(v1::ConsistencySpec::ASP);
    auto client = cluster.Client("job", {table});
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->CreateTables(asp, 1).ok());
    std::vector<float> v(table.shape().dims(0));
    EXPECT_TRUE((*client)->Pull(0, {{{table.name(), v.data()}}, {}}).ok());
  }

  // The client whose table hostile connections must leave alone: job "job", table "w" (1000
  // floats, ASP, over TCP), pulled into `before` (nullptr after a test failure).
  static std::unique_ptr<PsClient> VictimClient(InProcessCluster& cluster,
                                                std::vector<float>* before) {
    auto client =
        TcpClient(cluster, DenseSpec("w", {1000}, kAdam, 256), v1::ConsistencySpec::ASP, 1);
    if (client == nullptr) return nullptr;
    before->assign(1000, 0.f);
    absl::Status st = client->Pull(0, {{{"w", before->data()}}, {}});
    if (!st.ok()) {
      ADD_FAILURE() << st;
      return nullptr;
    }
    return client;
  }

  // A client that requires `transport` fails its pull with a message containing `why`.
  static void RequiredTransportFails(InProcessCluster& cluster, const v1::TableSpec& table,
                                     DataTransport transport, const std::string& why) {
    PsClientOptions o;
    o.data_transport = transport;
    o.call_timeout = absl::Seconds(1);
    auto strict = cluster.Client("job", {table}, 0, o);
    ASSERT_TRUE(strict.ok());
    std::vector<float> v(table.shape().dims(0));
    absl::Status st = (*strict)->Pull(0, {{{table.name(), v.data()}}, {}});
    EXPECT_FALSE(st.ok());
    EXPECT_TRUE(absl::StrContains(st.message(), why)) << st;
  }

  // What the server of a Train() run passed through shared memory.
  struct ShmUse {
    int connections = 0;
    uint64_t received = 0;  // Payload bytes.
    uint64_t sent = 0;
  };

  // Runs the same 5 steps of push-pull against `servers` fresh servers with `transport`;
  // returns the final dense (`dense` values in blocks of `block`) and sparse values.
  static std::vector<float> Train(DataTransport transport, bool* used_ok, int servers = 1,
                                  uint64_t dense = 3000, uint64_t block = 512,
                                  PsClient::Stats* stats = nullptr,
                                  size_t shm_ring_bytes = 16 << 20, ShmUse* shm = nullptr) {
    InProcessCluster cluster(servers);
    EXPECT_TRUE(cluster.status().ok()) << cluster.status();
    auto w = DenseSpec("w", {dense}, kAdam, block);
    auto e = SparseSpec("e", 8, 1000, kAdam);
    auto client = ClientWith(cluster, {w, e}, transport, v1::ConsistencySpec::BSP, 1,
                             absl::Seconds(20), shm_ring_bytes);
    *used_ok = client != nullptr;
    if (client == nullptr) return {};
    std::vector<float> wv(dense), g(dense);
    std::vector<uint64_t> keys = {1, 7, 7, 999};
    std::vector<float> rows(keys.size() * 8), rg(keys.size() * 8);
    for (int step = 0; step < 5; ++step) {
      for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.01f * i + step);
      for (size_t i = 0; i < rg.size(); ++i) rg[i] = std::cos(0.1f * i - step);
      absl::Status st = client->PushPull(step, {{{"w", g.data()}}, {{"e", keys, rg.data()}}},
                                            {{{"w", wv.data()}}, {{"e", keys, rows.data()}}});
      if (!st.ok()) {
        ADD_FAILURE() << st;
        *used_ok = false;
      }
    }
    wv.insert(wv.end(), rows.begin(), rows.end());
    if (stats != nullptr) *stats = client->stats();
    if (shm != nullptr) {
      shm->connections = cluster.server(0)->data_shm_connections();
      shm->received = cluster.server(0)->data_shm_bytes_received();
      shm->sent = cluster.server(0)->data_shm_bytes_sent();
    }
    return wv;
  }
};

TEST_F(TcpDataPlaneTest, SameValuesAsGrpcBitForBit) {
  bool ok_tcp, ok_grpc;
  std::vector<float> tcp = Train(DataTransport::kTcp, &ok_tcp);
  std::vector<float> grpc = Train(DataTransport::kGrpc, &ok_grpc);
  ASSERT_TRUE(ok_tcp && ok_grpc);
  ASSERT_EQ(tcp.size(), grpc.size());
  EXPECT_EQ(std::memcmp(tcp.data(), grpc.data(), tcp.size() * sizeof(float)), 0);
}

// A call to several servers drives their connections together (TcpConn::WaitAll): 6 MB each
// way over three servers, more than their sockets hold, so replies arrive while frames to the
// other servers are still being written.
TEST_F(TcpDataPlaneTest, ACallToSeveralServersMatchesGrpcBitForBit) {
  bool ok_tcp, ok_grpc;
  PsClient::Stats stats;
  std::vector<float> tcp =
      Train(DataTransport::kTcp, &ok_tcp, 3, 1536 * 1024, 64 * 1024, &stats);
  EXPECT_EQ(stats.joint_waits, 5u) << "each of the 5 calls read its three servers together";
  std::vector<float> grpc = Train(DataTransport::kGrpc, &ok_grpc, 3, 1536 * 1024, 64 * 1024);
  ASSERT_TRUE(ok_tcp && ok_grpc);
  ASSERT_EQ(tcp.size(), grpc.size());
  EXPECT_EQ(std::memcmp(tcp.data(), grpc.data(), tcp.size() * sizeof(float)), 0);
}

// Two threads of one client call the same three servers at once (a worker's background push and
// prefetching pull): each call completes with its own values whether its thread drives the
// connections or the other one does.
TEST_F(TcpDataPlaneTest, ConcurrentCallsToSeveralServersEachComplete) {
  InProcessCluster cluster(3);
  ASSERT_TRUE(cluster.status().ok());
  const uint64_t n = 256 * 1024;
  const v1::OptimizerSpec sgd = Optimizer(v1::OptimizerSpec::SGD, 0.5f);
  auto a = DenseSpec("a", {n}, sgd, 16 * 1024);
  auto b = DenseSpec("b", {n}, sgd, 16 * 1024);
  auto client = ClientWith(cluster, {a, b}, DataTransport::kTcp, v1::ConsistencySpec::ASP, 1);
  ASSERT_NE(client, nullptr);
  std::vector<float> a0(n), b0(n);
  ASSERT_TRUE(client->Pull(0, {{{"a", a0.data()}, {"b", b0.data()}}, {}}).ok());
  constexpr int kRounds = 20;
  std::vector<float> av(n);
  absl::Status sa, sb;
  int b_mismatches = 0;
  std::thread ta([&] {  // Pushes `a` step by step and reads it back.
    std::vector<float> g(n, 1.f);
    for (int r = 0; r < kRounds && sa.ok(); ++r) {
      sa = client->PushPull(r, {{{"a", g.data()}}, {}}, {{{"a", av.data()}}, {}});
    }
  });
  std::thread tb([&] {  // Meanwhile reads `b`, which nobody changes.
    std::vector<float> bv(n);
    for (int r = 0; r < 2 * kRounds && sb.ok(); ++r) {
      sb = client->Pull(0, {{{"b", bv.data()}}, {}});
      if (sb.ok() && std::memcmp(bv.data(), b0.data(), n * sizeof(float)) != 0) ++b_mismatches;
    }
  });
  ta.join();
  tb.join();
  ASSERT_TRUE(sa.ok()) << sa;
  ASSERT_TRUE(sb.ok()) << sb;
  EXPECT_EQ(b_mismatches, 0);
  EXPECT_GT(client->stats().joint_waits, 0u);
  // SGD: each push moves a weight by -0.5 * gradient; the last call read all kRounds pushes.
  for (uint64_t i = 0; i < n; i += 997) {
    ASSERT_NEAR(av[i], a0[i] - 0.5f * kRounds, 1e-3f) << i;
  }
  for (int s = 0; s < 3; ++s) EXPECT_EQ(cluster.server(s)->data_connections(), 1) << s;
}

TEST_F(TcpDataPlaneTest, ServerReportsItsPortAndCountsTheTraffic) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok());
  v1::ServerStatus st = StatusOf(cluster.addresses()[0]);
  EXPECT_GT(st.data_port(), 0u);
  EXPECT_EQ(static_cast<int>(st.data_port()), cluster.server(0)->data_port());
  auto client =
      TcpClient(cluster, DenseSpec("w", {1000}, kAdam, 256), v1::ConsistencySpec::ASP, 1);
  ASSERT_NE(client, nullptr);
  std::vector<float> g(1000, 1.f), v(1000);
  ASSERT_TRUE(client->PushPull(0, {{{"w", g.data()}}, {}}, {{{"w", v.data()}}, {}}).ok());
  v1::ServerStatus after = StatusOf(cluster.addresses()[0]);
  EXPECT_EQ(after.times().chunks_in(), 4u);  // 4 blocks of 256 pushed over TCP.
  EXPECT_EQ(after.bytes_in_total(), 4000u);
}

TEST_F(TcpDataPlaneTest, HostileBytesAreRefusedAndChangeNothing) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok());
  std::vector<float> before;
  auto client = VictimClient(cluster, &before);
  ASSERT_NE(client, nullptr);
  const int port = cluster.server(0)->data_port();

  {  // Not our protocol at all: INVALID_ARGUMENT, then the connection is closed.
    int fd = Connect(port);
    SendRaw(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    absl::Status st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "bad magic")) << st;
    close(fd);
  }
  {  // A frame announcing more than the limit: refused before anything is allocated.
    int fd = Connect(port);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameMessage, 0xfffffff0u, 0));
    absl::Status st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "exceeds the limit")) << st;
    close(fd);
  }
  {  // A well-framed message that is not a PushChunk: INVALID_ARGUMENT naming it.
    int fd = Connect(port);
    std::string junk = "\xff\xff\xff\xff\xff";
    SendRaw(fd, Header(kTcpFrameMagic, kFrameMessage, junk.size(), 0) + junk);
    absl::Status st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "PushChunk")) << st;
    close(fd);
  }
  {  // A valid chunk for an unknown job: NOT_FOUND naming the job.
    int fd = Connect(port);
    v1::PushChunk c;
    c.set_request_id(1);
    c.mutable_tag()->set_job_id("no-such-job");
    c.set_epoch(1);
    c.mutable_slice()->set_table("w");
    c.set_dtype(v1::DT_FLOAT32);
    c.set_last(true);
    std::string grad(256 * 4, '\0');
    auto frame = OutFrame::Message(
        EncodeWithPayload(c, kPushChunkValuesField, {grpc::Slice(grad)}));
    ASSERT_TRUE(frame.ok());
    ASSERT_TRUE(frame->SendRest(fd).ok());
    absl::Status st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsNotFound(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "no-such-job")) << st;
    close(fd);
  }
  {  // A client that vanishes inside a frame.
    int fd = Connect(port);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameMessage, 1000, 0) + std::string(10, 'x'));
    close(fd);
  }
  {  // A client claiming to send the server's status frame.
    int fd = Connect(port);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameStatus, 2, 0) + "ok");
    EXPECT_TRUE(absl::IsInvalidArgument(ReadUntilStatus(fd)));
    close(fd);
  }
  // Nothing changed, and the server still serves.
  std::vector<float> after(1000);
  ASSERT_TRUE(client->Pull(0, {{{"w", after.data()}}, {}}).ok());
  EXPECT_EQ(before, after);
  std::vector<float> g(1000, 1.f);
  EXPECT_TRUE(client->PushPull(0, {{{"w", g.data()}}, {}}, {{{"w", after.data()}}, {}}).ok());
  EXPECT_NE(before, after);
}

// One chunk of a push-pull round of job "job", table "w" (1 worker), sent as raw frames.
void SendRoundChunk(int fd, uint64_t request, int64_t step, uint64_t block, bool step_final,
                    bool last) {
  v1::PushChunk c;
  c.set_request_id(request);
  c.mutable_tag()->set_job_id("job");
  c.mutable_tag()->set_step(step);
  c.mutable_tag()->set_seq(block);
  c.set_epoch(1);
  c.mutable_slice()->set_table("w");
  c.mutable_slice()->set_block(block);
  c.set_dtype(v1::DT_FLOAT32);
  c.set_pull_after(true);
  c.set_pull_clock(step + 1);
  c.set_step_final(step_final);
  c.set_last(last);
  c.set_end_of_step(last);
  std::vector<float> g(256, 1.f);
  auto frame = OutFrame::Message(EncodeWithPayload(
      c, kPushChunkValuesField,
      {grpc::Slice(std::string(reinterpret_cast<const char*>(g.data()), g.size() * 4))}));
  ASSERT_TRUE(frame.ok());
  ASSERT_TRUE(frame->SendRest(fd).ok());
}

// Whether a frame arrives within `ms`; reads it into `chunk` if so.
bool ReplyWithin(int fd, int ms, v1::PullChunk* chunk) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, ms) != 1) return false;
  auto h = ReadFrameHeader(fd);
  EXPECT_TRUE(h.ok()) << h.status();
  if (!h.ok()) return false;
  std::string body(h->length, '\0');
  EXPECT_TRUE(ReadFull(fd, body.data(), body.size()).ok());
  EXPECT_EQ(h->kind, kFrameMessage) << body;
  EXPECT_TRUE(chunk->ParseFromString(body));
  return true;
}

// BSP, one worker: a round that ends the worker's step marks every chunk step_final, and each
// block's new value comes back as soon as that block is applied, before the rest of the round
// (and its end_of_step) has even been sent. Without the mark the reads wait for the step's end.
TEST_F(TcpDataPlaneTest, BlocksOfAStepFinalRoundComeBackBeforeTheRoundEnds) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok());
  auto client = TcpClient(cluster, DenseSpec("w", {1024}, kAdam, 256),
                          v1::ConsistencySpec::BSP, 1);
  ASSERT_NE(client, nullptr);
  std::vector<float> initial(1024);
  ASSERT_TRUE(client->Pull(0, {{{"w", initial.data()}}, {}}).ok());
  const int fd = Connect(cluster.server(0)->data_port());

  // Step 0, marked: block 0's reply arrives while blocks 1..3 are still unsent.
  SendRoundChunk(fd, 1, 0, 0, true, false);
  v1::PullChunk reply;
  ASSERT_TRUE(ReplyWithin(fd, 10000, &reply)) << "no reply before the round's end";
  EXPECT_EQ(reply.request_id(), 1u);
  EXPECT_EQ(reply.index(), 0u);
  EXPECT_FALSE(reply.last());
  EXPECT_EQ(reply.min_clock(), 1);
  ASSERT_EQ(reply.values().size(), 256u * 4);
  std::vector<float> got(256);
  std::memcpy(got.data(), reply.values().data(), got.size() * 4);
  for (int i = 0; i < 256; ++i) {
    ASSERT_NE(got[i], initial[i]) << "the reply must carry the updated block (element " << i << ")";
  }
  for (uint64_t b = 1; b < 4; ++b) SendRoundChunk(fd, 1, 0, b, true, b == 3);
  for (uint32_t b = 1; b < 4; ++b) {
    ASSERT_TRUE(ReplyWithin(fd, 10000, &reply));
    EXPECT_EQ(reply.index(), b);
    EXPECT_EQ(reply.last(), b == 3);
  }

  // Step 1, not marked: block 0's read waits for the worker's clock (the round's last chunk).
  SendRoundChunk(fd, 2, 1, 0, false, false);
  EXPECT_FALSE(ReplyWithin(fd, 300, &reply)) << "served before the step ended";
  for (uint64_t b = 1; b < 4; ++b) SendRoundChunk(fd, 2, 1, b, false, b == 3);
  for (uint32_t b = 0; b < 4; ++b) {
    ASSERT_TRUE(ReplyWithin(fd, 10000, &reply));
    EXPECT_EQ(reply.request_id(), 2u);
    EXPECT_EQ(reply.index(), b);
  }
  close(fd);
}

// A pull parked on the server (BSP: it needs this worker's own push) holds the connection's I/O
// on its thread; the push another thread queues meanwhile must still go out, or neither ends.
TEST_F(TcpDataPlaneTest, APushQueuedWhileAnotherThreadWaitsIsSent) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok());
  auto client =
      TcpClient(cluster, DenseSpec("w", {5000}, kAdam, 1000), v1::ConsistencySpec::BSP, 1);
  ASSERT_NE(client, nullptr);
  std::vector<float> v(5000), g(5000, 1.f), init(5000);
  ASSERT_TRUE(client->Pull(0, {{{"w", init.data()}}, {}}).ok());
  absl::Status pulled;
  absl::Time pulled_at;
  std::thread puller([&] {
    pulled = client->Pull(1, {{{"w", v.data()}}, {}});  // Waits for step 0's push.
    pulled_at = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time pushed_at = absl::Now();
  ASSERT_TRUE(client->Push(0, {{{"w", g.data()}}, {}}).ok());
  puller.join();
  ASSERT_TRUE(pulled.ok()) << pulled;
  EXPECT_GE(pulled_at, pushed_at);
  EXPECT_LT(pulled_at - pushed_at, absl::Seconds(5));
  // Adam's first step moves every weight by the learning rate against the gradient.
  for (size_t i = 0; i < v.size(); ++i) ASSERT_NEAR(v[i], init[i] - 0.01f, 1e-4f) << i;
}

// A pull that outlives its deadline fails with DEADLINE_EXCEEDED, nothing is written into the
// caller's tensor, and the client carries on: on `servers` servers (a table of `n` elements in
// blocks of `block`), BSP with 2 workers of which worker 1 never comes.
void ExpectParkedPullTimesOutAndClientCarriesOn(int servers, uint64_t n, uint64_t block) {
  InProcessCluster cluster(servers);
  ASSERT_TRUE(cluster.status().ok());
  auto client = TcpDataPlaneTest::TcpClient(cluster, DenseSpec("w", {n}, kAdam, block),
                                            v1::ConsistencySpec::BSP, 2, absl::Milliseconds(500));
  ASSERT_NE(client, nullptr);
  std::vector<float> v(n, -7.f);
  const absl::Time t0 = absl::Now();
  absl::Status st = client->Pull(1, {{{"w", v.data()}}, {}});
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_EQ(v, std::vector<float>(n, -7.f)) << "nothing written after the deadline";
  EXPECT_TRUE(client->Pull(0, {{{"w", v.data()}}, {}}).ok());
  for (float x : v) ASSERT_NE(x, -7.f);
}

TEST_F(TcpDataPlaneTest, DeadlineOnAParkedPullLeavesTheClientUsable) {
  ExpectParkedPullTimesOutAndClientCarriesOn(1, 100, 100);
}

// The same across two servers driven together: the deadline ends the call on both.
TEST_F(TcpDataPlaneTest, DeadlineOnAPullParkedOnTwoServersLeavesTheClientUsable) {
  ExpectParkedPullTimesOutAndClientCarriesOn(2, 4000, 1000);
}

TEST_F(TcpDataPlaneTest, OffWithDataPortMinusOne) {
  PsServerOptions so;
  so.data_port = -1;
  InProcessCluster cluster(1, so);
  ASSERT_TRUE(cluster.status().ok());
  EXPECT_EQ(StatusOf(cluster.addresses()[0]).data_port(), 0u);
  auto w = DenseSpec("w", {100}, kAdam, 100);
  // auto falls back to gRPC and works; tcp required: a clear error.
  AutoClientPulls(cluster, w);
  EXPECT_EQ(cluster.server(0)->data_connections(), 0);
  RequiredTransportFails(cluster, w, DataTransport::kTcp, "offers no TCP data port");
}

// A worker on the server's host reaches it through the abstract Unix socket named in Status (the
// same frames, no TCP/IP stack); `tcp` keeps it on the TCP port; results are the same bit for bit.
TEST_F(TcpDataPlaneTest, WorkersOnTheSameHostUseTheUnixSocket) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok());
  v1::ServerStatus st = StatusOf(cluster.addresses()[0]);
  EXPECT_FALSE(st.data_unix().empty());
  EXPECT_EQ(st.data_unix(), cluster.server(0)->data_unix());
  EXPECT_EQ(st.pid(), static_cast<uint32_t>(getpid()));

  auto w = DenseSpec("w", {1000}, kAdam, 256);
  v1::ConsistencySpec asp;
  asp.set_mode(v1::ConsistencySpec::ASP);
  auto client = cluster.Client("job", {w});  // auto
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->CreateTables(asp, 1).ok());
  std::vector<float> g(1000, 1.f), v(1000);
  ASSERT_TRUE((*client)->PushPull(0, {{{"w", g.data()}}, {}}, {{{"w", v.data()}}, {}}).ok());
  EXPECT_EQ(cluster.server(0)->data_unix_connections(), 1);
  EXPECT_EQ(cluster.server(0)->data_connections(), 1);

  PsClientOptions o;
  o.data_transport = DataTransport::kTcp;
  auto tcp = cluster.Client("job", {w}, 0, o);
  ASSERT_TRUE(tcp.ok());
  ASSERT_TRUE((*tcp)->Pull(1, {{{"w", v.data()}}, {}}).ok());
  EXPECT_EQ(cluster.server(0)->data_unix_connections(), 1) << "tcp must not use the Unix socket";
  EXPECT_EQ(cluster.server(0)->data_connections(), 2);

  bool ok_unix, ok_tcp;
  std::vector<float> over_unix = Train(DataTransport::kUnix, &ok_unix);
  std::vector<float> over_tcp = Train(DataTransport::kTcp, &ok_tcp);
  ASSERT_TRUE(ok_unix && ok_tcp);
  ASSERT_EQ(over_unix.size(), over_tcp.size());
  EXPECT_EQ(std::memcmp(over_unix.data(), over_tcp.data(), over_unix.size() * 4), 0);
}

// --data_unix=false: no socket advertised, auto uses TCP, `unix` fails naming the reason.
TEST_F(TcpDataPlaneTest, UnixSocketOffWithDataUnixFalse) {
  PsServerOptions so;
  so.data_unix = false;
  InProcessCluster cluster(1, so);
  ASSERT_TRUE(cluster.status().ok());
  EXPECT_TRUE(StatusOf(cluster.addresses()[0]).data_unix().empty());
  auto w = DenseSpec("w", {100}, kAdam, 100);
  AutoClientPulls(cluster, w);
  EXPECT_EQ(cluster.server(0)->data_connections(), 1);
  EXPECT_EQ(cluster.server(0)->data_unix_connections(), 0);
  RequiredTransportFails(cluster, w, DataTransport::kUnix, "offers no Unix data socket");
}

// Anyone on the host may bind an abstract name: a socket not served by the server's process is
// refused, and a name nobody serves is unavailable.
TEST_F(TcpDataPlaneTest, AUnixSocketNotServedByTheServerIsRefused) {
  const std::string name = absl::StrCat("pscluster-test-impostor/", getpid());
  int l = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(bind(l, reinterpret_cast<sockaddr*>(&a), len), 0) << std::strerror(errno);
  ASSERT_EQ(listen(l, 4), 0);
  auto pool = BufferPool::Create();
  const uint32_t other_pid = static_cast<uint32_t>(getpid()) + 1;
  auto bad = TcpConn::OpenUnix(name, other_pid, "server-x", pool, absl::ZeroDuration());
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(bad.status())) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "not by the server")) << bad.status();
  // The process that serves the name passes; this one answers the authentication exchange as
  // a server would.
  std::thread serve([l] {
    int c = -1;
    while (true) {  // The refused connection above is still in the backlog: skip it.
      c = accept(l, nullptr, nullptr);
      if (c < 0) return;
      const std::string challenge =
          Header(kTcpFrameMagic, kFrameChallenge, 32, 0) + std::string(32, 'n');
      char auth[kFrameHeaderBytes + 8];  // No proof, no job: 8 bytes of body.
      if (send(c, challenge.data(), challenge.size(), MSG_NOSIGNAL) ==
              static_cast<ssize_t>(challenge.size()) &&
          ReadFull(c, auth, sizeof(auth)).ok()) {
        break;
      }
      close(c);
    }
    SendRaw(c, Header(kTcpFrameMagic, kFrameAuth, 0, 1));
    char sink[64];
    while (recv(c, sink, sizeof(sink), 0) > 0) {
    }
    close(c);
  });
  auto good = TcpConn::OpenUnix(name, static_cast<uint32_t>(getpid()), "server-x", pool,
                                absl::ZeroDuration());
  EXPECT_TRUE(good.ok()) << good.status();
  if (good.ok()) (*good)->Shutdown(absl::Seconds(1));
  good = absl::UnavailableError("closed");
  serve.join();
  close(l);
  auto none = TcpConn::OpenUnix(name + "-gone", static_cast<uint32_t>(getpid()), "server-x", pool,
                                absl::ZeroDuration());
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::IsUnavailable(none.status())) << none.status();
}

// A worker on the server's host passes payloads through shared memory (the default): the same
// values bit for bit as over TCP, with rings big enough for a whole round, with rings too small
// for one (the rest goes over the socket), and without shared memory.
TEST_F(TcpDataPlaneTest, SharedMemoryOnTheSameHostMatchesTcpBitForBit) {
  const uint64_t dense = 30000, block = 8192;  // 4 blocks of 32 KiB per round.
  const uint64_t pushed = 5 * dense * 4;       // Dense payload bytes over the 5 steps.
  bool ok_shm, ok_small, ok_sock, ok_tcp;
  ShmUse shm, small, sock;
  std::vector<float> over_shm =
      Train(DataTransport::kUnix, &ok_shm, 1, dense, block, nullptr, 16 << 20, &shm);
  std::vector<float> over_small =
      Train(DataTransport::kUnix, &ok_small, 1, dense, block, nullptr, 64 << 10, &small);
  std::vector<float> over_sock =
      Train(DataTransport::kUnix, &ok_sock, 1, dense, block, nullptr, 0, &sock);
  std::vector<float> over_tcp = Train(DataTransport::kTcp, &ok_tcp, 1, dense, block);
  ASSERT_TRUE(ok_shm && ok_small && ok_sock && ok_tcp);
  EXPECT_EQ(shm.connections, 1);
  EXPECT_EQ(shm.received, pushed) << "every dense gradient through the request ring";
  EXPECT_EQ(shm.sent, pushed) << "every dense reply through the reply ring";
  EXPECT_EQ(small.connections, 1);
  EXPECT_GT(small.received, 0u);
  EXPECT_LT(small.received, pushed) << "a 64 KiB ring cannot hold a 128 KiB round";
  EXPECT_EQ(sock.connections, 0);
  EXPECT_EQ(sock.received, 0u);
  for (const auto* v : {&over_shm, &over_small, &over_sock}) {
    ASSERT_EQ(v->size(), over_tcp.size());
    EXPECT_EQ(std::memcmp(v->data(), over_tcp.data(), over_tcp.size() * 4), 0);
  }
}

// --data_shm_mib=0 on the server: the offer is refused and the Unix socket carries the payloads.
TEST_F(TcpDataPlaneTest, SharedMemoryRefusedByTheServerFallsBackToTheSocket) {
  PsServerOptions so;
  so.data_shm_max_bytes = 0;
  InProcessCluster cluster(1, so);
  ASSERT_TRUE(cluster.status().ok());
  auto w = DenseSpec("w", {100000}, kAdam, 25000);
  AutoClientPulls(cluster, w);  // 100 KB blocks: through the ring, had it been attached.
  EXPECT_EQ(cluster.server(0)->data_shm_bytes_sent(), 0u);
  auto conn = TcpConn::OpenUnix(cluster.server(0)->data_unix(), static_cast<uint32_t>(getpid()),
                                "server-0", BufferPool::Create(), absl::ZeroDuration(), 1 << 20);
  ASSERT_TRUE(conn.ok()) << conn.status();
  EXPECT_FALSE((*conn)->shared_memory());
  EXPECT_STREQ((*conn)->transport(), "unix");
}

// Shared-memory frames a client has no right to send, or that point outside its ring, and
// memory the server must not map: refused with a status naming the fault (or, for the memory,
// an answer that the connection goes on without it); nothing changes and the server serves on.
TEST_F(TcpDataPlaneTest, HostileSharedMemoryIsRefusedAndChangesNothing) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok());
  std::vector<float> before;
  auto client = VictimClient(cluster, &before);
  ASSERT_NE(client, nullptr);
  const std::string name = cluster.server(0)->data_unix();
  auto position = [](uint64_t p) {
    std::string s(8, '\0');
    PutU64(s.data(), p);
    return s;
  };
  // The attach answer: kind 4, aux 1 (attached) or 0 (refused).
  auto answer = [](int fd) -> int {
    auto h = ReadFrameHeader(fd);
    if (!h.ok() || h->kind != kFrameAttach) return -1;
    return static_cast<int>(h->aux);
  };

  {  // A payload in shared memory with none attached.
    int fd = ConnectUnix(name);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameShmMessage, 5 + 8, 100) + "junk!" + position(0));
    absl::Status st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "none is attached")) << st;
    close(fd);
  }
  {  // Memory that is not sealed (it could shrink under the server): refused, and the
     // connection goes on without it.
    int memfd = memfd_create("hostile", MFD_CLOEXEC);
    ASSERT_EQ(ftruncate(memfd, 4096 + 2 * 65536), 0);
    int fd = ConnectUnix(name);
    SendAttach(fd, memfd, 65536, 65536);
    close(memfd);
    EXPECT_EQ(answer(fd), 0);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameShmMessage, 5 + 8, 100) + "junk!" + position(0));
    EXPECT_TRUE(absl::StrContains(ReadUntilStatus(fd).message(), "none is attached"));
    close(fd);
  }
  {  // An attach frame without memory, and one whose sizes disagree with the memory.
    int fd = ConnectUnix(name);
    SendAttach(fd, -1, 65536, 65536);
    EXPECT_EQ(answer(fd), 0);
    close(fd);
    auto area = ShmArea::Create(65536, 65536);
    ASSERT_TRUE(area.ok());
    fd = ConnectUnix(name);
    SendAttach(fd, (*area)->fd(), 65536, 1 << 20);
    EXPECT_EQ(answer(fd), 0);
    close(fd);
  }
  {  // Attached, then a payload that does not lie in the ring.
    auto area = ShmArea::Create(65536, 65536);
    ASSERT_TRUE(area.ok());
    int fd = ConnectUnix(name);
    SendAttach(fd, (*area)->fd(), 65536, 65536);
    EXPECT_EQ(answer(fd), 1);
    EXPECT_EQ(cluster.server(0)->data_shm_connections(), 1);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameShmMessage, 5 + 8, 40000) + "junk!" +
                    position(30000));
    absl::Status st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "does not lie in the ring")) << st;
    close(fd);
  }
  {  // A malformed attach frame, and one on the TCP port (not the first frame of a Unix socket).
    int fd = ConnectUnix(name);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameAttach, 3, 0) + "abc");
    absl::Status st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::StrContains(st.message(), "attach frame of 3 bytes")) << st;
    close(fd);
    fd = Connect(cluster.server(0)->data_port());
    SendRaw(fd, Header(kTcpFrameMagic, kFrameAttach, 16, 0) + std::string(16, '\0'));
    st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "not the first after authentication")) << st;
    close(fd);
  }
  {  // A shared-memory frame announcing more than a frame may hold.
    int fd = ConnectUnix(name);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameShmMessage, 8, 0xfffffff0u) + position(0));
    EXPECT_TRUE(absl::IsInvalidArgument(ReadUntilStatus(fd)));
    close(fd);
  }
  // Nothing changed, and the server still serves, shared memory included.
  std::vector<float> after(1000);
  ASSERT_TRUE(client->Pull(0, {{{"w", after.data()}}, {}}).ok());
  EXPECT_EQ(before, after);
  auto w = DenseSpec("w2", {100000}, kAdam, 25000);
  AutoClientPulls(cluster, w);
  EXPECT_GT(cluster.server(0)->data_shm_bytes_sent(), 0u);
}

TEST(IsLocalHostTest, LoopbackAndOwnAddressesOnly) {
  EXPECT_TRUE(IsLocalHost("127.0.0.1"));
  EXPECT_TRUE(IsLocalHost("127.3.4.5"));
  EXPECT_TRUE(IsLocalHost("localhost"));
  EXPECT_TRUE(IsLocalHost("::1"));
  EXPECT_FALSE(IsLocalHost("192.0.2.1"));  // TEST-NET-1: never assigned.
  EXPECT_FALSE(IsLocalHost("2001:db8::1"));
  EXPECT_FALSE(IsLocalHost("no-such-host.invalid"));
}

TEST_F(TcpDataPlaneTest, NeverOpenedUnderTls) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/certs";
  const std::string script =
      std::string(std::getenv("TEST_SRCDIR")) + "/pscluster/tests/integration/make_certs.sh";
  ASSERT_EQ(std::system((script + " " + dir).c_str()), 0) << "openssl failed";
  PsServerOptions so;
  so.tls.cert = dir + "/server.pem";
  so.tls.key = dir + "/server.key";
  InProcessCluster cluster(1, so);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  EXPECT_EQ(cluster.server(0)->data_port(), 0);
  EXPECT_TRUE(cluster.server(0)->data_unix().empty()) << "no plaintext socket under TLS";
  ChannelOptions ch;
  ch.tls.ca = dir + "/ca.pem";
  EXPECT_EQ(StatusOf(cluster.addresses()[0], ch).data_port(), 0u);
  EXPECT_TRUE(StatusOf(cluster.addresses()[0], ch).data_unix().empty());
  // A TLS client trains over gRPC.
  auto w = DenseSpec("w", {100}, kAdam, 100);
  PsClientOptions o;
  o.channel = ch;
  auto client = cluster.Client("job", {w}, 0, o);
  ASSERT_TRUE(client.ok());
  v1::ConsistencySpec asp;
  asp.set_mode(v1::ConsistencySpec::ASP);
  ASSERT_TRUE((*client)->CreateTables(asp, 1).ok());
  std::vector<float> g(100, 1.f), v(100);
  EXPECT_TRUE((*client)->PushPull(0, {{{"w", g.data()}}, {}}, {{{"w", v.data()}}, {}}).ok());
}

}  // namespace
}  // namespace pscluster
