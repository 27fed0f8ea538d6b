// The dialer against a real in-process server on loopback: which socket each transport gets,
// and when none is used (gRPC) and why.
#include "server/client/dialer.h"

#include "absl/strings/match.h"
#include "common/channel.h"
#include "gtest/gtest.h"
#include "server/testing/cluster.h"

namespace pscluster {
namespace {

class DialerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto channel = MakeChannel(cluster_.addresses()[0], {});
    ASSERT_TRUE(channel.ok()) << channel.status();
    stub_ = v1::ParameterServer::NewStub(*channel);
  }
  absl::StatusOr<Dialed> Dial(DataTransport t, ChannelOptions ch = {}) {
    DialOptions o;
    o.transport = t;
    o.channel = std::move(ch);
    o.pool = BufferPool::Create(1 << 20);
    return DialDataConn(stub_.get(), cluster_.addresses()[0], o);
  }

  ::pscluster::testing::InProcessCluster cluster_{1};
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

TEST_F(DialerTest, AutoTakesTheUnixSocketOnThisHostAndTcpWhenAsked) {
  auto autod = Dial(DataTransport::kAuto);
  ASSERT_TRUE(autod.ok()) << autod.status();
  ASSERT_NE(autod->conn, nullptr) << autod->why_none;
  EXPECT_EQ(autod->conn->transport(), "unix");

  auto tcp = Dial(DataTransport::kTcp);
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  ASSERT_NE(tcp->conn, nullptr) << tcp->why_none;
  EXPECT_EQ(tcp->conn->transport(), "tcp");

  auto unix_only = Dial(DataTransport::kUnix);
  ASSERT_TRUE(unix_only.ok()) << unix_only.status();
  ASSERT_NE(unix_only->conn, nullptr);
}

TEST_F(DialerTest, GrpcTlsAndCredentialsDialNothingAndSayWhy) {
  auto grpc = Dial(DataTransport::kGrpc);
  ASSERT_TRUE(grpc.ok());
  EXPECT_EQ(grpc->conn, nullptr);
  EXPECT_TRUE(absl::StrContains(grpc->why_none.message(), "grpc")) << grpc->why_none;

  ChannelOptions with_token;
  with_token.bearer_token = "secret";
  auto token = Dial(DataTransport::kAuto, with_token);
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->conn, nullptr);
  EXPECT_TRUE(absl::StrContains(token->why_none.message(), "credential")) << token->why_none;
}

TEST(DialerNoServerTest, AnUnreachableServerIsAnErrorNamingIt) {
  auto channel = MakeChannel("127.0.0.1:1", {});
  ASSERT_TRUE(channel.ok());
  auto stub = v1::ParameterServer::NewStub(*channel);
  DialOptions o;
  o.timeout = absl::Milliseconds(300);
  o.pool = BufferPool::Create(1 << 20);
  auto d = DialDataConn(stub.get(), "127.0.0.1:1", o);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(absl::StrContains(d.status().message(), "127.0.0.1:1")) << d.status();
}

TEST(DataTransportTest, ParsesTheFourNamesAndRefusesOthers) {
  EXPECT_EQ(*ParseDataTransport("auto"), DataTransport::kAuto);
  EXPECT_EQ(*ParseDataTransport("grpc"), DataTransport::kGrpc);
  EXPECT_EQ(*ParseDataTransport("tcp"), DataTransport::kTcp);
  EXPECT_EQ(*ParseDataTransport("unix"), DataTransport::kUnix);
  auto bad = ParseDataTransport("rdma");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "rdma"));
}

}  // namespace
}  // namespace pscluster
