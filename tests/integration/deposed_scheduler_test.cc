// A deposed scheduler's calls are refused by the servers (common/scheduler_term.h): a parameter
// server started in this process, and the scheduler's own gRPC client (GrpcClusterRpc) of two
// leaders, the later one with the higher term.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/clock.h"
#include "common/scheduler_term.h"
#include "gmock/gmock.h"
#include "proto/ps.grpc.pb.h"
#include "scheduler/grpc_cluster_rpc.h"
#include "server/ps_server.h"
#include "worker/standalone.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

class DeposedSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = PsServer::Start(PsServerOptions{}, &clock_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    auto channel = MakeChannel(server_->address());
    ASSERT_TRUE(channel.ok()) << channel.status();
    stub_ = v1::ParameterServer::NewStub(*channel);
  }
  void TearDown() override { server_->Shutdown(); }

  v1::UpdateShardMapRequest MapRequest(uint64_t epoch) {
    auto map = worker::RoundRobinShardMap("j", {server_->address()}, 8);
    EXPECT_TRUE(map.ok()) << map.status();
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = *map;
    req.mutable_map()->set_epoch(epoch);
    req.set_self(map->servers(0).node_id());
    return req;
  }
  scheduler::GrpcClusterRpc Leader(int64_t term) {
    scheduler::GrpcClusterRpcOptions o;
    o.scheduler_term = term;
    return scheduler::GrpcClusterRpc(o);
  }
  // UpdateShardMap over a plain stub, `term` in the header ("" = none); the epoch in force.
  absl::StatusOr<uint64_t> Send(const v1::UpdateShardMapRequest& req, const std::string& term) {
    grpc::ClientContext ctx;
    if (!term.empty()) ctx.AddMetadata(kSchedulerTermHeader, term);
    v1::UpdateShardMapResponse resp;
    grpc::Status s = stub_->UpdateShardMap(&ctx, req, &resp);
    if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    return resp.epoch();
  }

  RealClock clock_;
  std::unique_ptr<PsServer> server_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

TEST_F(DeposedSchedulerTest, ALateShardMapAndDropOfADeposedLeaderChangeNothing) {
  scheduler::GrpcClusterRpc leader = Leader(20);
  scheduler::GrpcClusterRpc deposed = Leader(10);
  ASSERT_TRUE(leader.UpdateShardMap(server_->address(), MapRequest(3)).ok());

  // The deposed leader's newer epoch and its drop are refused, naming both terms.
  absl::Status s = deposed.UpdateShardMap(server_->address(), MapRequest(4));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("deposed scheduler (term 10)"));
  EXPECT_THAT(s.message(), HasSubstr("the scheduler of term 20 leads"));
  s = deposed.DropJob(server_->address(), "j");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;

  // Epoch 3 is still the one in force: epoch 4 never reached the job.
  auto epoch = Send(MapRequest(3), "20");
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  EXPECT_EQ(*epoch, 3u);

  // A later leader's calls go through, and then the previous one is deposed in turn.
  EXPECT_TRUE(Leader(35).UpdateShardMap(server_->address(), MapRequest(5)).ok());
  EXPECT_EQ(leader.UpdateShardMap(server_->address(), MapRequest(6)).code(),
            absl::StatusCode::kFailedPrecondition);
  epoch = Send(MapRequest(5), "");  // A call without a term (one scheduler) is not checked.
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  EXPECT_EQ(*epoch, 5u);
}

TEST_F(DeposedSchedulerTest, AMalformedTermIsRefusedAndChangesNothing) {
  ASSERT_TRUE(Send(MapRequest(2), "7").ok());
  for (const std::string bad : {"x", "-3", "0", "99999999999999999999999"}) {
    auto r = Send(MapRequest(9), bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr(kSchedulerTermHeader)) << bad;
  }
  auto epoch = Send(MapRequest(2), "7");
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  EXPECT_EQ(*epoch, 2u);
}

}  // namespace
}  // namespace pscluster
