// The plaintext TCP data plane of ps_server (--data_port): the same results as gRPC PushPull,
// hostile bytes on the port refused without harm, off with --data_port=-1, and the client's
// fallback to gRPC (TLS on the port: tls_data_plane_test; the Unix socket and shared memory:
// local_data_plane_test.cc).
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
#include "tests/integration/data_plane_fixture.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

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

// One server's part of a call fails (that server's shard map moved on: FAILED_PRECONDITION)
// while the other's is parked at a BSP gate waiting for a push that only a retry with the new
// map would bring: the call ends with the failure at once instead of waiting out its deadline
// on the parked part (which, with every rank doing the same, deadlocked a job after a shard
// move until the call timeout).
void ExpectAFailedPartEndsTheCall(DataTransport transport) {
  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  // A call deadline far beyond the test's: waiting it out fails the test.
  constexpr absl::Duration kCallTimeout = absl::Seconds(240);
  auto client = TcpDataPlaneTest::ClientWith(cluster, {DenseSpec("w", {4000}, kAdam, 1000)},
                                             transport, v1::ConsistencySpec::BSP, 2,
                                             kCallTimeout);
  ASSERT_NE(client, nullptr);
  // Server 1 moves to epoch 2; server 0 and the client stay at epoch 1.
  auto channel = MakeChannel(cluster.addresses()[1]);
  ASSERT_TRUE(channel.ok());
  auto stub = v1::ParameterServer::NewStub(*channel);
  v1::UpdateShardMapRequest req;
  *req.mutable_map() = cluster.Map("job", 2);
  req.set_self(req.map().servers(1).node_id());
  v1::UpdateShardMapResponse resp;
  auto ctx = CallContext(absl::Seconds(5));
  ASSERT_TRUE(stub->UpdateShardMap(ctx.get(), req, &resp).ok());

  std::vector<float> v(4000, -7.f);
  const absl::Time t0 = absl::Now();
  absl::Status st = client->Pull(1, {{{"w", v.data()}}, {}});  // Parks at server 0.
  EXPECT_LT(absl::Now() - t0, kCallTimeout / 2) << "the call waited for its deadline";
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "older than the server's epoch 2")) << st;
  EXPECT_EQ(v, std::vector<float>(4000, -7.f)) << "nothing written by a failed call";
}

TEST_F(TcpDataPlaneTest, AFailedPartEndsACallParkedOnAnotherServer) {
  ExpectAFailedPartEndsTheCall(DataTransport::kTcp);
}

TEST_F(TcpDataPlaneTest, AFailedPartEndsACallParkedOnAnotherServerOverGrpc) {
  ExpectAFailedPartEndsTheCall(DataTransport::kGrpc);
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

TEST(IsLocalHostTest, LoopbackAndOwnAddressesOnly) {
  EXPECT_TRUE(IsLocalHost("127.0.0.1"));
  EXPECT_TRUE(IsLocalHost("127.3.4.5"));
  EXPECT_TRUE(IsLocalHost("localhost"));
  EXPECT_TRUE(IsLocalHost("::1"));
  EXPECT_FALSE(IsLocalHost("192.0.2.1"));  // TEST-NET-1: never assigned.
  EXPECT_FALSE(IsLocalHost("2001:db8::1"));
  EXPECT_FALSE(IsLocalHost("no-such-host.invalid"));
}

}  // namespace
}  // namespace pscluster
