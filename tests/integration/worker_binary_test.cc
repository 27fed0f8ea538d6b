// Cluster tier: the real ps_worker binary: registration with the address it advertises,
// heartbeats, a clean stop on SIGTERM, exit codes for bad flags (2) and an unreachable scheduler
// (138), and the standalone mode's errors.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>

#include "absl/synchronization/mutex.h"
#include "common/channel.h"
#include "common/grpc_server.h"
#include "common/testing/garbage_calls.h"
#include "proto/scheduler.grpc.pb.h"
#include "proto/worker.pb.h"
#include "server/testing/daemon.h"

namespace pscluster {
namespace {

using testing::Daemon;
using testing::RunfilePath;

const std::string kWorker = RunfilePath("worker/ps_worker");

std::string Tmp(const std::string& name) { return std::string(std::getenv("TEST_TMPDIR")) + "/" + name; }

class RecordingScheduler final : public v1::Scheduler::Service {
 public:
  grpc::Status RegisterNode(grpc::ServerContext*, const v1::RegisterNodeRequest* req,
                            v1::RegisterNodeResponse* resp) override {
    absl::MutexLock l(&mu);
    node = req->node();
    resp->set_node_id("worker-9");
    resp->set_lease_ms(2000);
    resp->set_heartbeat_interval_ms(50);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    heartbeats++;
    return grpc::Status::OK;
  }
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest* req,
                          v1::DeregisterResponse*) override {
    absl::MutexLock l(&mu);
    deregistered = req->node_id();
    return grpc::Status::OK;
  }
  absl::Mutex mu;
  v1::NodeInfo node ABSL_GUARDED_BY(mu);
  std::string deregistered ABSL_GUARDED_BY(mu);
  std::atomic<int> heartbeats{0};
};

TEST(WorkerBinaryTest, RegistersWithTheAdvertisedAddressAndStopsCleanly) {
  RecordingScheduler sched;
  auto server = GrpcServer::Start({}, {&sched});
  ASSERT_TRUE(server.ok());
  Daemon d(kWorker,
           {"--listen=0.0.0.0:0", "--advertise_host=localhost", "--port_file=" + Tmp("w.port"),
            "--scheduler=" + (*server)->address(), "--cpu_slots=3", "--device=cpu"},
           Tmp("w.log"));
  auto address = d.WaitForPortFile(Tmp("w.port"));
  ASSERT_TRUE(address.ok()) << address.status();
  std::string port = address->substr(address->rfind(':') + 1);
  for (int i = 0; i < 200 && sched.heartbeats.load() < 3; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(sched.heartbeats.load(), 3) << d.Log();
  {
    absl::MutexLock l(&sched.mu);
    EXPECT_EQ(sched.node.address(), "localhost:" + port);
    EXPECT_EQ(sched.node.role(), v1::ROLE_WORKER);
    EXPECT_EQ(sched.node.capacity().cpu_slots(), 3u);
    EXPECT_EQ(sched.node.capacity().gpus(), 0u);  // --device=cpu offers no GPU.
  }
  // Bytes that parse as no request: INVALID_ARGUMENT naming the method, from every method.
  (void)v1::AssignTaskRequest::descriptor();  // Links the service's descriptor in.
  auto channel = MakeChannel("127.0.0.1:" + port);
  ASSERT_TRUE(channel.ok());
  testing::ExpectEveryMethodRefusesGarbage(*channel, "pscluster.v1.WorkerControl");
  EXPECT_EQ(d.Signal(SIGTERM), 0) << d.Log();
  absl::MutexLock l(&sched.mu);
  EXPECT_EQ(sched.deregistered, "worker-9");
}

TEST(WorkerBinaryTest, UnreachableSchedulerExitsRetryable) {
  std::string nobody;
  {
    auto s = GrpcServer::Start({}, {});
    ASSERT_TRUE(s.ok());
    nobody = (*s)->address();
  }
  Daemon d(kWorker, {"--scheduler=" + nobody, "--register_timeout_sec=1"}, Tmp("u.log"));
  EXPECT_EQ(d.Wait(absl::Seconds(30)), 138) << d.Log();
  EXPECT_NE(d.Log().find(nobody), std::string::npos) << d.Log();
}

TEST(WorkerBinaryTest, BadFlagsExitTwoNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  } cases[] = {
      {{"--scheduler=127.0.0.1:1", "--device=tpu"}, "--device"},
      {{"--scheduler=127.0.0.1:1", "--cpu_threads=-2"}, "--cpu_threads"},
      {{"--scheduler=127.0.0.1:1", "--log_level=loud"}, "--log_level"},
      {{"--scheduler=127.0.0.1:1", "--data_transport=udp"}, "--data_transport"},
      {{}, "--scheduler"},  // Neither a scheduler nor a standalone job.
      {{"--job=/nonexistent/job.yaml", "--servers=127.0.0.1:1"}, "/nonexistent/job.yaml"},
      {{"--job=" + RunfilePath("deploy/examples/fashion_mlp.yaml")}, "--servers"},
      {{"--job=" + RunfilePath("deploy/examples/fashion_mlp.yaml"), "--servers=127.0.0.1:1",
        "--rank=5"},
       "--rank"},
  };
  int i = 0;
  for (const Case& c : cases) {
    Daemon d(kWorker, c.args, Tmp("bad" + std::to_string(i++) + ".log"));
    EXPECT_EQ(d.Wait(absl::Seconds(20)), 2) << c.expected << "\n" << d.Log();
    EXPECT_NE(d.Log().find(c.expected), std::string::npos) << d.Log();
  }
}

}  // namespace
}  // namespace pscluster
