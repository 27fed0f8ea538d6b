#include "common/channel.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>
#include <thread>

#include "absl/synchronization/notification.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "proto/grpc_health.grpc.pb.h"
#include "tests/cluster/tcp_proxy.h"

namespace pscluster {
namespace {

// A synchronous health service: it does not touch gRPC's shared callback queue, so the only users
// of that queue in this process are the client channels below.
class SyncHealth final : public grpc::health::v1::Health::Service {
 public:
  explicit SyncHealth(bool serving = true) : serving_(serving) {}

 private:
  grpc::health::v1::HealthCheckResponse::ServingStatus Status() const {
    return serving_ ? grpc::health::v1::HealthCheckResponse::SERVING
                    : grpc::health::v1::HealthCheckResponse::NOT_SERVING;
  }
  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse* resp) override {
    resp->set_status(Status());
    return grpc::Status::OK;
  }
  // Streams until the client goes away.
  grpc::Status Watch(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest*,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override {
    grpc::health::v1::HealthCheckResponse resp;
    resp.set_status(Status());
    writer->Write(resp);
    while (!ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(2));
    return grpc::Status::CANCELLED;
  }
  const bool serving_;
};

// A server on 127.0.0.1 (any free port) answering with `health`; its port in *port.
std::unique_ptr<grpc::Server> StartHealthServer(SyncHealth* health, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(health);
  return builder.BuildAndStart();
}

// A Watch stream read with the callback API. The test owns it: it cancels the stream, waits for
// OnDone, then deletes it (a reactor that deleted itself in OnDone could be gone by the time the
// test cancels it, if the stream ended first).
class Watcher final : public grpc::ClientReadReactor<grpc::health::v1::HealthCheckResponse> {
 public:
  Watcher(grpc::health::v1::Health::Stub* stub) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stub->async()->Watch(&ctx_, &req_, this);
    StartRead(&resp_);
    StartCall();
  }
  void Cancel() { ctx_.TryCancel(); }
  void WaitDone() { done_.WaitForNotification(); }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&resp_);
  }
  void OnDone(const grpc::Status&) override { done_.Notify(); }

 private:
  grpc::ClientContext ctx_;
  grpc::health::v1::HealthCheckRequest req_;
  grpc::health::v1::HealthCheckResponse resp_;
  absl::Notification done_;
};

// Channels that make callback calls (and leave a stream open as they are dropped), created and
// dropped one after another from two threads: the pattern of workers that open a data-plane
// client per task.
TEST(ChannelTest, CallbackChannelsComeAndGoSafely) {
  SyncHealth health;
  int port = 0;
  auto server = StartHealthServer(&health, &port);
  ASSERT_NE(server, nullptr);
  std::string address = "127.0.0.1:" + std::to_string(port);
  auto round = [&](int rounds) {
    for (int i = 0; i < rounds; ++i) {
      auto ch = MakeChannel(address);
      ASSERT_TRUE(ch.ok());
      auto stub = grpc::health::v1::Health::NewStub(*ch);
      auto ctx = CallContext(absl::Seconds(10));
      grpc::health::v1::HealthCheckRequest req;
      grpc::health::v1::HealthCheckResponse resp;
      absl::Notification done;
      grpc::Status status;
      stub->async()->Check(ctx.get(), &req, &resp, [&](grpc::Status s) {
        status = s;
        done.Notify();
      });
      done.WaitForNotification();
      ASSERT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
      // A stream still open when its channel is dropped, cancelled a moment later.
      auto watcher = std::make_unique<Watcher>(stub.get());
      stub.reset();
      ch->reset();
      absl::SleepFor(absl::Milliseconds(1));
      watcher->Cancel();
      watcher->WaitDone();
    }
  };
  std::thread other(round, 100);
  round(100);
  other.join();
  server->Shutdown();
}

// A server whose handshake takes longer than a loaded machine's or a distant peer's would (the
// HTTP/2 SETTINGS frame held back 600 ms) is reached all the same: a connection attempt may last
// 5 s. With 100 ms, as before, every attempt timed out ("connection attempt timed out before
// receiving SETTINGS frame") and the call failed at once.
TEST(ChannelTest, AServerSlowToHandshakeIsReachedAllTheSame) {
  SyncHealth health;
  int port = 0;
  auto server = StartHealthServer(&health, &port);
  ASSERT_NE(server, nullptr);
  auto proxy = testing::TcpProxy::Start("127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  (*proxy)->DelayNewConnections(absl::Milliseconds(600));
  auto ch = MakeChannel((*proxy)->address());
  ASSERT_TRUE(ch.ok()) << ch.status();
  auto stub = grpc::health::v1::Health::NewStub(*ch);
  auto ctx = CallContext(absl::Seconds(10));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status status = stub->Check(ctx.get(), req, &resp);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  stub.reset();
  ch->reset();
  proxy->reset();
  server->Shutdown();
}

TEST(ChannelTest, BadAddressIsRefused) {
  EXPECT_EQ(MakeChannel("nohostport").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeChannel("").status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = MakeChannel("127.0.0.1:7070,nohostport");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'nohostport'"), std::string::npos) << bad.status();
  EXPECT_EQ(MakeChannel("127.0.0.1:7070,[::1]:7070").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeChannel("127.0.0.1:7070,no-such-host.invalid:7070").status().code(),
            absl::StatusCode::kUnavailable);
}

// A list of addresses (several schedulers, one leading): calls go only to the servers whose
// health is SERVING. A follower's own Check would answer NOT_SERVING; every call here is answered
// by the serving one.
TEST(ChannelTest, AListOfAddressesReachesOnlyTheServingOnes) {
  SyncHealth follower(false), leader(true);
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::vector<int> ports;
  for (SyncHealth* h : {&follower, &leader, &follower}) {
    int port = 0;
    servers.push_back(StartHealthServer(h, &port));
    ASSERT_NE(servers.back(), nullptr);
    ports.push_back(port);
  }
  const std::string list = "127.0.0.1:" + std::to_string(ports[0]) + ", 127.0.0.1:" +
                           std::to_string(ports[1]) + ",localhost:" + std::to_string(ports[2]);
  auto ch = MakeChannel(list);
  ASSERT_TRUE(ch.ok()) << ch.status();
  // "dns:///" names (every address a name resolves to) are routed the same way.
  auto by_name = MakeChannel("dns:///localhost:" + std::to_string(ports[1]));
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.set_wait_for_ready(true);
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = grpc::health::v1::Health::NewStub(*by_name)->Check(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  ASSERT_TRUE(ch.ok()) << ch.status();
  auto stub = grpc::health::v1::Health::NewStub(*ch);
  int served = 0;
  for (int i = 0; i < 30; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.set_wait_for_ready(true);  // The first call waits for the health checks' first answers.
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = stub->Check(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    if (resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) ++served;
  }
  EXPECT_EQ(served, 30);
  // With the serving one gone, calls fail fast instead of reaching a follower.
  servers[1]->Shutdown(std::chrono::system_clock::now());
  absl::SleepFor(absl::Milliseconds(300));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  for (auto& server : servers) server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace pscluster
