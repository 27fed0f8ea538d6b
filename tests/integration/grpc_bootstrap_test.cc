// In-process tier: a server built by common/grpc_server on port 0 serves health checking and
// reflection for the pscluster.v1 services.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>

#include "common/channel.h"
#include "common/grpc_server.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpcpp/impl/codegen/client_context.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "tests/integration/reflection_wire.pb.h"

namespace pscluster {
namespace {

using pscluster::testing::ServerReflectionRequest;
using pscluster::testing::ServerReflectionResponse;

class BootstrapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcServerOptions opts;
    opts.listen_address = "127.0.0.1:0";
    const char* tmp = std::getenv("TEST_TMPDIR");
    port_file_ = std::string(tmp ? tmp : "/tmp") + "/bootstrap.port";
    opts.port_file = port_file_;
    auto server = GrpcServer::Start(opts, {&ps_, &scheduler_, &worker_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto ch = MakeChannel(server_->address());
    ASSERT_TRUE(ch.ok()) << ch.status();
    channel_ = *ch;
  }

  // Sends one reflection request on the real reflection method and returns the reply.
  ServerReflectionResponse Reflect(const ServerReflectionRequest& req) {
    grpc::internal::RpcMethod method(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        grpc::internal::RpcMethod::BIDI_STREAMING, channel_);
    auto ctx = CallContext(absl::Seconds(10));
    std::unique_ptr<grpc::ClientReaderWriter<ServerReflectionRequest, ServerReflectionResponse>> rw(
        grpc::internal::ClientReaderWriterFactory<ServerReflectionRequest,
                                                  ServerReflectionResponse>::Create(channel_.get(),
                                                                                    method,
                                                                                    ctx.get()));
    EXPECT_TRUE(rw->Write(req));
    rw->WritesDone();
    ServerReflectionResponse resp;
    EXPECT_TRUE(rw->Read(&resp));
    grpc::Status st = rw->Finish();
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  }

  v1::ParameterServer::CallbackService ps_;
  v1::Scheduler::CallbackService scheduler_;
  v1::WorkerControl::CallbackService worker_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::string port_file_;
};

TEST_F(BootstrapTest, BindsPortZeroAndReportsTheRealPort) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(server_->port()));
  std::ifstream f(port_file_);
  std::string line;
  std::getline(f, line);
  EXPECT_EQ(line, server_->address());
}

TEST_F(BootstrapTest, HealthIsServingThenNotServingAfterShutdownStarts) {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  auto ctx = CallContext(absl::Seconds(10));
  grpc::Status st = stub->Check(ctx.get(), req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  server_->SetServing(false);
  auto ctx2 = CallContext(absl::Seconds(10));
  ASSERT_TRUE(stub->Check(ctx2.get(), req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

TEST_F(BootstrapTest, ReflectionListsThePsclusterServices) {
  ServerReflectionRequest req;
  req.set_list_services("*");
  ServerReflectionResponse resp = Reflect(req);
  ASSERT_TRUE(resp.has_list_services_response()) << resp.DebugString();
  std::set<std::string> names;
  for (const auto& s : resp.list_services_response().service()) names.insert(s.name());
  EXPECT_TRUE(names.count("pscluster.v1.ParameterServer")) << resp.DebugString();
  EXPECT_TRUE(names.count("pscluster.v1.Scheduler"));
  EXPECT_TRUE(names.count("pscluster.v1.WorkerControl"));
}

TEST_F(BootstrapTest, ReflectionServesTheServiceDescriptors) {
  ServerReflectionRequest req;
  req.set_file_containing_symbol("pscluster.v1.ParameterServer");
  ServerReflectionResponse resp = Reflect(req);
  ASSERT_TRUE(resp.has_file_descriptor_response()) << resp.DebugString();
  bool found = false;
  for (const std::string& bytes : resp.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto fd;
    ASSERT_TRUE(fd.ParseFromString(bytes));
    if (fd.name() != "proto/ps.proto") continue;
    found = true;
    ASSERT_EQ(fd.service_size(), 1);
    std::set<std::string> methods;
    for (const auto& m : fd.service(0).method()) methods.insert(m.name());
    for (const char* m : {"Pull", "Push", "PushPull", "CreateTables", "Checkpoint", "Status"}) {
      EXPECT_TRUE(methods.count(m)) << m;
    }
  }
  EXPECT_TRUE(found);
}

// Every channel pings its server every 10 s while it is up, with or without calls
// (common/channel.cc), so that a dead peer is noticed even while a call waits in silence (a pull
// parked for a slow worker). The servers must accept those pings. By gRPC's defaults a server
// counts a ping that comes sooner than 5 minutes after the previous one, with nothing sent in
// between, as a strike, and at the third it drops the connection with GOAWAY "too_many_pings",
// failing every call on it. Here: a connection that has been idle (two pings), then a stream on
// which neither side says anything for 30 s (three more pings), must survive and still work.
TEST_F(BootstrapTest, ASilentStreamSurvivesTheChannelsKeepalivePings) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckResponse hresp;
  {
    auto ctx = CallContext(absl::Seconds(5));
    ASSERT_TRUE(health->Check(ctx.get(), hreq, &hresp).ok());
  }
  absl::SleepFor(absl::Seconds(22));  // Idle: pings at about 10 and 20 s.
  ASSERT_EQ(channel_->GetState(false), GRPC_CHANNEL_READY);

  grpc::internal::RpcMethod method(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING, channel_);
  auto ctx = CallContext(absl::Seconds(60));
  std::unique_ptr<grpc::ClientReaderWriter<ServerReflectionRequest, ServerReflectionResponse>> rw(
      grpc::internal::ClientReaderWriterFactory<ServerReflectionRequest,
                                                ServerReflectionResponse>::Create(channel_.get(),
                                                                                  method,
                                                                                  ctx.get()));
  const absl::Time until = absl::Now() + absl::Seconds(32);
  while (absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(250));
    ASSERT_EQ(channel_->GetState(false), GRPC_CHANNEL_READY)
        << "the connection went down under a silent stream, "
        << absl::ToInt64Seconds(until - absl::Now()) << " s before the end";
  }
  ServerReflectionRequest req;
  req.set_list_services("");
  ASSERT_TRUE(rw->Write(req));
  rw->WritesDone();
  ServerReflectionResponse resp;
  EXPECT_TRUE(rw->Read(&resp));
  grpc::Status st = rw->Finish();
  EXPECT_TRUE(st.ok()) << st.error_code() << ": " << st.error_message();
}

TEST_F(BootstrapTest, UnimplementedMethodGetsAStatusNotACrash) {
  auto stub = v1::Scheduler::NewStub(channel_);
  v1::GetJobRequest req;
  v1::Job job;
  auto ctx = CallContext(absl::Seconds(10));
  grpc::Status st = stub->GetJob(ctx.get(), req, &job);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(BootstrapErrorsTest, BadAddressesAreRefusedClearly) {
  GrpcServerOptions opts;
  opts.listen_address = "no-port-here";
  auto s = GrpcServer::Start(opts, {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("no-port-here"), std::string::npos);

  opts.listen_address = "127.0.0.1:0";
  opts.port_file = "/nonexistent-dir/port";
  s = GrpcServer::Start(opts, {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("--port_file"), std::string::npos);

  opts.port_file.clear();
  opts.tls.cert = "/nonexistent/cert.pem";
  opts.tls.key = "/nonexistent/key.pem";
  s = GrpcServer::Start(opts, {});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--tls_cert"), std::string::npos) << s.status();
}

TEST(BootstrapErrorsTest, PortInUseIsUnavailable) {
  GrpcServerOptions opts;
  auto first = GrpcServer::Start(opts, {});
  ASSERT_TRUE(first.ok());
  opts.listen_address = (*first)->address();
  auto second = GrpcServer::Start(opts, {});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

}  // namespace
}  // namespace pscluster
