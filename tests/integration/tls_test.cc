// TLS and mutual TLS between a pscluster server and client, with real certificates made by
// openssl for the test.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/channel.h"
#include "common/grpc_server.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "tests/integration/test_certs.h"

namespace pscluster {
namespace {

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = ::pscluster::testing::MakeTestCerts();
  }

  std::unique_ptr<GrpcServer> StartServer(bool mutual) {
    GrpcServerOptions opts;
    opts.tls.cert = dir_ + "/server.pem";
    opts.tls.key = dir_ + "/server.key";
    if (mutual) opts.tls.ca = dir_ + "/ca.pem";
    auto s = GrpcServer::Start(opts, {&service_});
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // Health check over a channel made with `opts`; returns the call's status.
  grpc::Status Check(const std::string& address, const ChannelOptions& opts) {
    auto ch = MakeChannel(address, opts);
    EXPECT_TRUE(ch.ok()) << ch.status();
    auto stub = grpc::health::v1::Health::NewStub(*ch);
    grpc::health::v1::HealthCheckResponse resp;
    auto ctx = CallContext(absl::Seconds(5));
    return stub->Check(ctx.get(), {}, &resp);
  }

  static std::string dir_;
  v1::Scheduler::CallbackService service_;
};

std::string TlsTest::dir_;

TEST_F(TlsTest, ServerTlsVerifiedByTheClient) {
  auto server = StartServer(/*mutual=*/false);
  ASSERT_NE(server, nullptr);
  ChannelOptions ok;
  ok.tls.ca = dir_ + "/ca.pem";
  EXPECT_TRUE(Check(server->address(), ok).ok());

  ChannelOptions wrong_ca;
  wrong_ca.tls.ca = dir_ + "/other-ca.pem";
  EXPECT_EQ(Check(server->address(), wrong_ca).error_code(), grpc::StatusCode::UNAVAILABLE);

  EXPECT_EQ(Check(server->address(), ChannelOptions{}).error_code(),
            grpc::StatusCode::UNAVAILABLE);  // Plaintext to a TLS port.
}

TEST_F(TlsTest, MutualTlsRequiresAClientCertificateFromTheCa) {
  auto server = StartServer(/*mutual=*/true);
  ASSERT_NE(server, nullptr);
  ChannelOptions full;
  full.tls.ca = dir_ + "/ca.pem";
  full.tls.cert = dir_ + "/client.pem";
  full.tls.key = dir_ + "/client.key";
  EXPECT_TRUE(Check(server->address(), full).ok());

  ChannelOptions no_cert;
  no_cert.tls.ca = dir_ + "/ca.pem";
  EXPECT_EQ(Check(server->address(), no_cert).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, BadFilesAreNamed) {
  GrpcServerOptions opts;
  opts.tls.cert = dir_ + "/server.pem";
  opts.tls.key = dir_ + "/missing.key";
  auto s = GrpcServer::Start(opts, {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("--tls_key"), std::string::npos) << s.status();

  opts.tls.key = dir_ + "/server.ext";  // Exists, not PEM.
  s = GrpcServer::Start(opts, {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("not a PEM file"), std::string::npos) << s.status();

  opts.tls.key.clear();
  s = GrpcServer::Start(opts, {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);

  ChannelOptions client;
  client.tls.cert = dir_ + "/client.pem";
  EXPECT_EQ(MakeChannel("127.0.0.1:1", client).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pscluster
