// Authentication of the TCP and Unix data plane (common/data_auth.h, server/tcp_frame.h): a
// server with --token_file opens its data sockets only to connections that prove a job's data
// secret; a connection is bound to the job (and worker) it proved; wrong, missing, replayed and
// fenced proofs are refused with the reason and the server keeps serving; a job with a secret
// takes no data on unauthenticated connections even on a server without --token_file; gRPC data
// calls prove the job's secret in their metadata.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/data_auth.h"
#include "common/status_convert.h"
#include "common/token_file.h"
#include "server/tcp_frame.h"
#include "server/testing/cluster.h"
#include "server/wire.h"
#include "tests/integration/raw_frames.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

constexpr char kToken[] = "worker-token-for-tests";

const v1::OptimizerSpec kSgd = Optimizer(v1::OptimizerSpec::SGD, 0.5f);

std::string Secret(const std::string& job) { return DeriveJobDataSecret("test cluster key", job); }

// A token file giving kToken the roles a worker and the scheduler need here.
std::string TokenFile() {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/data_auth_tokens_", getpid(), ".txt");
  std::ofstream(path) << Sha256Hex(kToken) << " tester scheduler,worker,viewer\n";
  return path;
}

class DataAuthTest : public ::testing::Test {
 protected:
  void StartCluster(bool tokens) {
    PsServerOptions so;
    if (tokens) so.token_file = TokenFile();
    cluster_ = std::make_unique<InProcessCluster>(1, so);
    ASSERT_TRUE(cluster_->status().ok()) << cluster_->status();
    channel_.bearer_token = tokens ? kToken : "";
  }

  // Installs the map of `job` on the server with the job's secret, as the scheduler does.
  void InstallSecret(const std::string& job, const std::string& secret) {
    auto channel = MakeChannel(cluster_->addresses()[0], channel_);
    ASSERT_TRUE(channel.ok());
    auto stub = v1::ParameterServer::NewStub(*channel);
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = cluster_->Map(job);
    req.set_self(req.map().servers(0).node_id());
    req.set_data_secret(secret);
    v1::UpdateShardMapResponse resp;
    auto ctx = CallContext(absl::Seconds(5), channel_);
    absl::Status st = FromGrpcStatus(stub->UpdateShardMap(ctx.get(), req, &resp), "map");
    ASSERT_TRUE(st.ok()) << st;
  }

  // A client of `job` as `worker` over `transport` proving `secret` (none when empty).
  std::unique_ptr<PsClient> Client(const std::string& job, const std::string& secret,
                                   DataTransport transport, uint32_t worker = 0) {
    PsClientOptions o;
    o.worker = worker;
    o.data_transport = transport;
    o.call_timeout = absl::Seconds(5);
    o.channel = channel_;
    o.data_secret = secret;
    auto c = cluster_->Client(job, {DenseSpec("w", {256}, kSgd, 256)}, worker, o);
    if (!c.ok()) {
      ADD_FAILURE() << c.status();
      return nullptr;
    }
    return std::move(*c);
  }

  // The same, with the job's table created (ASP, one worker) through it.
  std::unique_ptr<PsClient> ReadyClient(const std::string& job, const std::string& secret,
                                        DataTransport transport) {
    auto c = Client(job, secret, transport);
    if (c == nullptr) return nullptr;
    v1::ConsistencySpec asp;
    asp.set_mode(v1::ConsistencySpec::ASP);
    absl::Status st = c->CreateTables(asp, 1);
    if (!st.ok()) {
      ADD_FAILURE() << st;
      return nullptr;
    }
    return c;
  }

  static absl::Status PushPull(PsClient& c, int64_t step, float g, std::vector<float>* out) {
    std::vector<float> grad(256, g);
    out->assign(256, 0.f);
    return c.PushPull(step, {{{"w", grad.data()}}, {}}, {{{"w", out->data()}}, {}});
  }

  std::unique_ptr<InProcessCluster> cluster_;
  ChannelOptions channel_;
};

TEST_F(DataAuthTest, TokenServerServesProvenJobsOverTcpAndUnix) {
  StartCluster(/*tokens=*/true);
  InstallSecret("job", Secret("job"));
  for (DataTransport t : {DataTransport::kTcp, DataTransport::kUnix}) {
    auto c = ReadyClient("job", Secret("job"), t);
    ASSERT_NE(c, nullptr);
    std::vector<float> w;
    absl::Status st = PushPull(*c, 0, 1.f, &w);
    EXPECT_TRUE(st.ok()) << st;
  }
  EXPECT_GE(cluster_->server(0)->data_connections(), 1);
}

TEST_F(DataAuthTest, WrongOrMissingProofIsRefusedAndTheServerKeepsServing) {
  StartCluster(/*tokens=*/true);
  InstallSecret("job", Secret("job"));
  auto good = ReadyClient("job", Secret("job"), DataTransport::kTcp);
  ASSERT_NE(good, nullptr);
  std::vector<float> before, after;
  ASSERT_TRUE(PushPull(*good, 0, 0.f, &before).ok());

  auto wrong = Client("job", Secret("another job"), DataTransport::kTcp);
  ASSERT_NE(wrong, nullptr);
  std::vector<float> w;
  absl::Status st = PushPull(*wrong, 1, 100.f, &w);
  EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "wrong proof")) << st;

  // A credential but no secret: the client does not even try the sockets (a required TCP
  // transport then fails; auto would use gRPC, which checks the credential).
  auto none = Client("job", "", DataTransport::kTcp);
  ASSERT_NE(none, nullptr);
  st = PushPull(*none, 1, 100.f, &w);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "no job data secret")) << st;

  // Raw: a connection that gives no proof is refused by the server itself.
  int fd = ConnectRaw(cluster_->server(0)->data_port());
  bool required = false;
  ASSERT_FALSE(ReadChallenge(fd, &required).empty());
  EXPECT_TRUE(required);
  st = SendAuth(fd, "job", 0, 0, "");
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  close(fd);
  // Counted, by reason (pscluster_server_data_connections_refused_total): the wrong proof (each
  // of the wrong client's tries) and the missing one.
  EXPECT_GE(cluster_->server(0)->data_refusals()->auth.load(), 2u);
  EXPECT_EQ(cluster_->server(0)->data_refusals()->tls_handshake.load(), 0u);

  // Nothing changed: the good client reads the same values (a zero gradient pushed meanwhile).
  ASSERT_TRUE(PushPull(*good, 1, 0.f, &after).ok());
  EXPECT_EQ(before, after);
}

TEST_F(DataAuthTest, AProofIsBoundToItsNonceJobWorkerAndAttempt) {
  StartCluster(/*tokens=*/true);
  InstallSecret("job", Secret("job"));
  InstallSecret("other", Secret("other"));
  const int port = cluster_->server(0)->data_port();

  // Replay: a proof made for one connection's nonce fails on the next connection.
  int a = ConnectRaw(port);
  const std::string nonce = ReadChallenge(a);
  ASSERT_FALSE(nonce.empty());
  const std::string proof = DataAuthProof(Secret("job"), nonce, "job", 0, 0);
  int b = ConnectRaw(port);
  ASSERT_FALSE(ReadChallenge(b).empty());
  absl::Status st = SendAuth(b, "job", 0, 0, proof);
  EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
  close(b);
  // ...and claiming another worker with it fails too, while the honest claim passes.
  int c = ConnectRaw(port);
  const std::string nonce_c = ReadChallenge(c);
  st = SendAuth(c, "job", 1, 0, DataAuthProof(Secret("job"), nonce_c, "job", 0, 0));
  EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
  close(c);
  st = SendAuth(a, "job", 0, 0, proof);
  ASSERT_TRUE(st.ok()) << st;

  // Authenticated for "job": a chunk of job "other" on that connection is refused.
  v1::PushChunk chunk;
  chunk.set_request_id(1);
  chunk.mutable_tag()->set_job_id("other");
  chunk.set_epoch(1);
  chunk.mutable_slice()->set_table("w");
  chunk.set_dtype(v1::DT_FLOAT32);
  chunk.set_last(true);
  auto frame = OutFrame::Message(
      EncodeWithPayload(chunk, kPushChunkValuesField, {grpc::Slice(std::string(1024, '\0'))}));
  ASSERT_TRUE(frame.ok());
  ASSERT_TRUE(frame->SendRest(a).ok());
  st = ReadUntilStatus(a);
  EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "authenticated for job job, not for job other"))
      << st;
  close(a);
}

TEST_F(DataAuthTest, AFencedAttemptIsRefusedAtTheHandshake) {
  StartCluster(/*tokens=*/true);
  InstallSecret("job", Secret("job"));
  auto c = ReadyClient("job", Secret("job"), DataTransport::kTcp);
  ASSERT_NE(c, nullptr);
  auto channel = MakeChannel(cluster_->addresses()[0], channel_);
  ASSERT_TRUE(channel.ok());
  auto stub = v1::ParameterServer::NewStub(*channel);
  v1::FenceWorkerRequest fence;
  fence.set_job_id("job");
  fence.set_worker(0);
  fence.set_attempt(2);
  v1::FenceWorkerResponse resp;
  auto ctx = CallContext(absl::Seconds(5), channel_);
  ASSERT_TRUE(stub->FenceWorker(ctx.get(), fence, &resp).ok());

  int fd = ConnectRaw(cluster_->server(0)->data_port());
  const std::string nonce = ReadChallenge(fd);
  absl::Status st = SendAuth(fd, "job", 0, 1, DataAuthProof(Secret("job"), nonce, "job", 0, 1));
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  close(fd);
  fd = ConnectRaw(cluster_->server(0)->data_port());
  const std::string nonce2 = ReadChallenge(fd);
  st = SendAuth(fd, "job", 0, 2, DataAuthProof(Secret("job"), nonce2, "job", 0, 2));
  EXPECT_TRUE(st.ok()) << st;
  close(fd);
}

TEST_F(DataAuthTest, HostileHandshakesAreRefusedWithoutHarm) {
  StartCluster(/*tokens=*/true);
  InstallSecret("job", Secret("job"));
  const int port = cluster_->server(0)->data_port();
  {  // A message before authenticating.
    int fd = ConnectRaw(port);
    ReadChallenge(fd);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameMessage, 4, 0) + "abcd");
    absl::Status st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
    close(fd);
  }
  {  // An auth frame too large, and one with a proof of the wrong size.
    int fd = ConnectRaw(port);
    ReadChallenge(fd);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameAuth, 1 << 20, 0));
    absl::Status st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    close(fd);
    fd = ConnectRaw(port);
    ReadChallenge(fd);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameAuth, 8 + 5 + 3, 5) + std::string(16, 'x'));
    st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    close(fd);
  }
  {  // A handshake cut short: the client vanishes inside its auth frame.
    int fd = ConnectRaw(port);
    ReadChallenge(fd);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameAuth, 60, 32) + std::string(10, 'x'));
    close(fd);
  }
  // The server still serves an honest client.
  auto c = ReadyClient("job", Secret("job"), DataTransport::kTcp);
  ASSERT_NE(c, nullptr);
  std::vector<float> w;
  absl::Status st = PushPull(*c, 0, 1.f, &w);
  EXPECT_TRUE(st.ok()) << st;
}

// The handshake fuzzed: thousands of connections each answer the server's challenge with the
// honest auth frame mutated (bytes flipped anywhere, cut short, a header lying about its length,
// another job, worker or attempt, a proof of the wrong job, size or nonce: a replay). Only the
// exact honest frame may be accepted; every other one is refused with a status or closed,
// within the raw helpers' 10 s; the server never crashes, and afterwards serves the job with its
// values untouched. Deterministic (fixed seeds).
TEST_F(DataAuthTest, FuzzedHandshakesAreNeverAcceptedUnlessHonest) {
  StartCluster(/*tokens=*/true);
  InstallSecret("job", Secret("job"));
  InstallSecret("other", Secret("other"));
  auto good = ReadyClient("job", Secret("job"), DataTransport::kTcp);
  ASSERT_NE(good, nullptr);
  std::vector<float> before, after;
  ASSERT_TRUE(PushPull(*good, 0, 0.f, &before).ok());
  const int port = cluster_->server(0)->data_port();
  std::map<std::string, int> outcomes;
  std::string last_nonce;
  for (uint32_t seed : {1u, 2u}) {
    std::mt19937 rng(seed);
    auto pick = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
    for (int i = 0; i < 300; ++i) {
      SCOPED_TRACE(absl::StrCat("seed ", seed, ", connection ", i));
      int fd = ConnectRaw(port);
      ASSERT_GE(fd, 0);
      const std::string nonce = ReadChallenge(fd);
      ASSERT_FALSE(nonce.empty());
      std::string job = "job", proof = DataAuthProof(Secret("job"), nonce, "job", 0, 0);
      const std::string honest = AuthFrame(job, 0, 0, proof);
      uint32_t worker = 0, attempt = 0;
      std::string frame;
      bool end_writes = false;
      const uint32_t kind = pick(10);
      switch (kind) {
        case 0:  // The honest frame.
          frame = honest;
          break;
        case 1:  // Bytes flipped anywhere (header included).
          frame = honest;
          for (uint32_t k = 1 + pick(3); k > 0; --k) {
            frame[pick(frame.size())] ^= static_cast<char>(1 + pick(255));
          }
          end_writes = true;
          break;
        case 2:  // Cut short.
          frame = honest.substr(0, pick(honest.size()));
          end_writes = true;
          break;
        case 3: {  // A header lying about the body's or the proof's length.
          frame = honest;
          const uint32_t lies[] = {0, 1, 7, 8, 39, 41, kMaxAuthFrameBytes, kMaxAuthFrameBytes + 1,
                                   0xffffffffu, static_cast<uint32_t>(honest.size() - 16 + 1)};
          const uint32_t v = lies[pick(10)];
          const int at = pick(2) == 0 ? 8 : 12;  // Length, or the proof's size.
          for (int b = 0; b < 4; ++b) frame[at + b] = static_cast<char>((v >> (8 * b)) & 0xff);
          end_writes = true;
          break;
        }
        case 4: {  // Another job: unknown, the other job with this job's proof, long, empty.
          const std::string jobs[] = {"other", "jo", "job ", "", std::string(1100, 'j'),
                                      std::string("job\0x", 5)};
          job = jobs[pick(6)];
          frame = AuthFrame(job, worker, attempt, proof);
          end_writes = true;
          break;
        }
        case 5:  // Another worker or attempt with this claim's proof.
          worker = pick(2) == 0 ? 1 + pick(5) : 0xffffffffu;
          attempt = pick(2) == 0 ? pick(3) : 0xffffffffu;
          if (worker == 0 && attempt == 0) attempt = 1;
          frame = AuthFrame(job, worker, attempt, proof);
          end_writes = true;
          break;
        case 6: {  // A proof of the wrong size or of random bytes.
          proof.assign(pick(2) == 0 ? 32 : pick(64), '\0');
          for (char& c : proof) c = static_cast<char>(rng());
          frame = AuthFrame(job, worker, attempt, proof);
          end_writes = true;
          break;
        }
        case 7:  // Another job's secret.
          proof = DataAuthProof(Secret("other"), nonce, "job", 0, 0);
          frame = AuthFrame(job, worker, attempt, proof);
          end_writes = true;
          break;
        case 8:  // A replay: the previous connection's nonce.
          if (last_nonce.empty()) last_nonce = std::string(nonce.size(), 'n');
          frame = AuthFrame(job, worker, attempt,
                            DataAuthProof(Secret("job"), last_nonce, "job", 0, 0));
          end_writes = true;
          break;
        default:  // A frame of another kind first.
          frame = Header(kTcpFrameMagic, pick(8), pick(64), pick(64)) + std::string(pick(64), 'x');
          end_writes = true;
          break;
      }
      last_nonce = nonce;
      absl::Status st = SendAuthBytes(fd, frame, end_writes);
      close(fd);
      if (frame == honest) {
        EXPECT_TRUE(st.ok()) << "the honest frame was refused: " << st;
      } else {
        EXPECT_FALSE(st.ok()) << "a mutated handshake (kind " << kind << ") was accepted";
      }
      ++outcomes[st.ok() ? "accepted" : absl::StatusCodeToString(st.code())];
    }
  }
  std::string summary;
  for (const auto& [what, n] : outcomes) absl::StrAppend(&summary, " ", what, "=", n);
  std::cout << "handshakes by outcome:" << summary << "\n";
  // Refusals came from the checks (a status), not only from closed connections.
  EXPECT_GT(outcomes["PERMISSION_DENIED"], 0);
  EXPECT_GT(outcomes["INVALID_ARGUMENT"], 0);
  EXPECT_GT(outcomes["accepted"], 0);
  // The server still serves the job, whose values no hostile connection changed.
  ASSERT_TRUE(PushPull(*good, 1, 0.f, &after).ok());
  EXPECT_EQ(before, after);
}

// Without --token_file, connections may go unauthenticated, but only for jobs with no secret.
TEST_F(DataAuthTest, OpenServerStillProtectsJobsWithASecret) {
  StartCluster(/*tokens=*/false);
  InstallSecret("secret-job", Secret("secret-job"));
  auto open = ReadyClient("open-job", "", DataTransport::kTcp);
  ASSERT_NE(open, nullptr);
  std::vector<float> w;
  EXPECT_TRUE(PushPull(*open, 0, 1.f, &w).ok());

  auto owner = ReadyClient("secret-job", Secret("secret-job"), DataTransport::kTcp);
  ASSERT_NE(owner, nullptr);
  EXPECT_TRUE(PushPull(*owner, 0, 1.f, &w).ok());

  auto intruder = Client("secret-job", "", DataTransport::kTcp);
  ASSERT_NE(intruder, nullptr);
  absl::Status st = PushPull(*intruder, 1, 100.f, &w);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "prove its data secret")) << st;
}

// gRPC data calls prove the job's secret too (x-pscluster-data-auth metadata): a worker token
// alone no longer reaches every job's parameters through gRPC.
TEST_F(DataAuthTest, GrpcDataCallsProveTheJobsSecretForTheirWorkerAndAttempt) {
  StartCluster(/*tokens=*/true);
  InstallSecret("job", Secret("job"));
  auto good = ReadyClient("job", Secret("job"), DataTransport::kGrpc);
  ASSERT_NE(good, nullptr);
  std::vector<float> before, after, w;
  ASSERT_TRUE(PushPull(*good, 0, 0.f, &before).ok());

  auto wrong = Client("job", Secret("another job"), DataTransport::kGrpc);
  ASSERT_NE(wrong, nullptr);
  absl::Status st = PushPull(*wrong, 1, 100.f, &w);
  EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "wrong proof")) << st;

  auto none = Client("job", "", DataTransport::kGrpc);
  ASSERT_NE(none, nullptr);
  st = PushPull(*none, 1, 100.f, &w);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "x-pscluster-data-auth")) << st;

  // Raw Pull calls: a proof for worker 0 does not read as worker 1; a malformed value is named.
  auto channel = MakeChannel(cluster_->addresses()[0], channel_);
  ASSERT_TRUE(channel.ok());
  auto stub = v1::ParameterServer::NewStub(*channel);
  auto raw_pull = [&](uint32_t worker, const std::string& proof) {
    v1::PullRequest req;
    req.set_request_id(7);
    req.set_job_id("job");
    req.set_worker(worker);
    req.set_clock(0);
    auto ctx = CallContext(absl::Seconds(5), channel_);
    ctx->AddMetadata(kGrpcDataAuthKey, proof);
    auto reader = stub->Pull(ctx.get(), req);
    v1::PullChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return FromGrpcStatus(reader->Finish(), "Pull");
  };
  st = raw_pull(1, GrpcDataAuthValue(DataAuth{"job", 0, 0, Secret("job")}));
  EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "proves worker 0 of job job, not worker 1")) << st;
  st = raw_pull(0, "0:0:not-hex");
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "WORKER:ATTEMPT:PROOF")) << st;

  // Nothing the refused calls sent was applied (a zero gradient pushed meanwhile).
  ASSERT_TRUE(PushPull(*good, 1, 0.f, &after).ok());
  EXPECT_EQ(before, after);

  // A fenced attempt is refused on gRPC as on the sockets.
  v1::FenceWorkerRequest fence;
  fence.set_job_id("job");
  fence.set_worker(0);
  fence.set_attempt(2);
  v1::FenceWorkerResponse fresp;
  auto fctx = CallContext(absl::Seconds(5), channel_);
  ASSERT_TRUE(stub->FenceWorker(fctx.get(), fence, &fresp).ok());
  st = raw_pull(0, GrpcDataAuthValue(DataAuth{"job", 0, 1, Secret("job")}));
  EXPECT_TRUE(absl::IsAborted(st)) << st;

  // A job without a secret (a standalone server's) still needs no proof.
  auto open = ReadyClient("open-job", "", DataTransport::kGrpc);
  ASSERT_NE(open, nullptr);
  EXPECT_TRUE(PushPull(*open, 0, 1.f, &w).ok());
}

// A refused gRPC data call ends at once on the client, every time: the server finishes the call
// while the client's push may still be in flight, and the client's stream must end then too
// instead of leaving the round to its deadline.
TEST_F(DataAuthTest, RefusedGrpcDataCallsEndAtOnceOnTheClient) {
  StartCluster(/*tokens=*/true);
  InstallSecret("job", Secret("job"));
  auto owner = ReadyClient("job", Secret("job"), DataTransport::kGrpc);
  ASSERT_NE(owner, nullptr);
  std::vector<float> w;
  for (int i = 0; i < 60; ++i) {
    auto none = Client("job", "", DataTransport::kGrpc);
    ASSERT_NE(none, nullptr);
    absl::Status st = PushPull(*none, 1, 100.f, &w);
    ASSERT_TRUE(absl::IsUnauthenticated(st)) << "try " << i << ": " << st;
  }
}

TEST_F(DataAuthTest, AJobsSecretCannotBeReplaced) {
  StartCluster(/*tokens=*/true);
  InstallSecret("job", Secret("job"));
  InstallSecret("job", Secret("job"));  // The same again: fine.
  auto channel = MakeChannel(cluster_->addresses()[0], channel_);
  ASSERT_TRUE(channel.ok());
  auto stub = v1::ParameterServer::NewStub(*channel);
  v1::UpdateShardMapRequest req;
  *req.mutable_map() = cluster_->Map("job", 2);
  req.set_self(req.map().servers(0).node_id());
  req.set_data_secret(Secret("something else"));
  v1::UpdateShardMapResponse resp;
  auto ctx = CallContext(absl::Seconds(5), channel_);
  absl::Status st = FromGrpcStatus(stub->UpdateShardMap(ctx.get(), req, &resp), "map");
  EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
  req.set_data_secret("short");
  auto ctx2 = CallContext(absl::Seconds(5), channel_);
  st = FromGrpcStatus(stub->UpdateShardMap(ctx2.get(), req, &resp), "map");
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
}

// The data plane holds at most 256 connections: the next is closed at once, logged and counted
// (pscluster_server_data_connections_refused_total{reason="limit"}); once some close, new ones
// are taken again.
TEST_F(DataAuthTest, ConnectionsBeyondTheLimitAreClosedAndCounted) {
  StartCluster(/*tokens=*/false);
  const int port = cluster_->server(0)->data_port();
  std::vector<int> held;
  for (int i = 0; i < 256; ++i) {
    held.push_back(ConnectRaw(port));
    ASSERT_GE(held.back(), 0);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (cluster_->server(0)->data_connections() < 256 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(cluster_->server(0)->data_connections(), 256);
  const int extra = ConnectRaw(port);
  ASSERT_GE(extra, 0);
  pollfd p{extra, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1) << "the connection over the limit was not closed";
  char c;
  EXPECT_EQ(recv(extra, &c, 1, 0), 0) << "closed without a byte";
  close(extra);
  EXPECT_EQ(cluster_->server(0)->data_refusals()->limit.load(), 1u);
  for (int fd : held) close(fd);
  // Room again once the server has seen them go (finished connections are reaped as the next
  // one is accepted): a connection is served, its challenge comes.
  int next = -1;
  for (const absl::Time again = absl::Now() + absl::Seconds(20); absl::Now() < again;) {
    next = ConnectRaw(port);
    pollfd q{next, POLLIN, 0};
    if (poll(&q, 1, 2000) == 1 && recv(next, &c, 1, MSG_PEEK) == 1) break;
    close(next);
    next = -1;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_GE(next, 0) << "no connection was served after the others closed";
  bool required = true;
  EXPECT_FALSE(ReadChallenge(next, &required).empty());
  EXPECT_FALSE(required);
  close(next);
}

}  // namespace
}  // namespace pscluster
