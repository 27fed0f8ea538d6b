// Cluster tier: the real ps_server binary (a data dependency), on port 0 with a port file,
// talked to over loopback; registration with a scheduler; exit codes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include <atomic>

#include "common/channel.h"
#include "common/grpc_server.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "server/client/ps_client.h"
#include "server/testing/daemon.h"
#include "server/testing/test_tables.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

const std::string kBinary = RunfilePath("server/ps_server");

std::string Tmp(const std::string& name) { return TempDir(name); }

TEST(PsServerBinaryTest, ServesAClientChecksHealthAndStopsOnSigterm) {
  const std::string port_file = Tmp("serve.port"), ckpt = Tmp("serve-ckpt");
  Daemon d(kBinary, {"--port_file=" + port_file, "--checkpoint_dir=" + ckpt, "--log_level=info"},
           Tmp("serve.log"));
  auto address = d.WaitForPortFile(port_file);
  ASSERT_TRUE(address.ok()) << address.status();

  auto channel = *MakeChannel(*address);
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckResponse hresp;
  auto ctx = CallContext(absl::Seconds(5));
  ASSERT_TRUE(health->Check(ctx.get(), hreq, &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  PsClientOptions o;
  o.job_id = "bin";
  o.call_timeout = absl::Seconds(10);
  auto w = DenseSpec("w", {3, 1000}, Optimizer(v1::OptimizerSpec::ADAM, 0.01f), 1000);
  auto e = SparseSpec("e", 16, 0, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.1f));
  auto client = PsClient::Create(o, RoundRobinMap("bin", 1, {*address}), {w, e});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->InstallShardMap().ok());
  v1::ConsistencySpec bsp;
  ASSERT_TRUE((*client)->CreateTables(bsp, 1).ok());
  std::vector<float> v(3000), g(3000, 0.5f), rows(3 * 16), rg(3 * 16, 1.f);
  std::vector<uint64_t> keys = {3, 1u << 31, 3};
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE((*client)
                    ->PushPull(step, {{{"w", g.data()}}, {{"e", keys, rg.data()}}},
                               {{{"w", v.data()}}, {{"e", keys, rows.data()}}})
                    .ok());
  }
  auto statuses = (*client)->ServerStatuses();
  ASSERT_TRUE(statuses.ok());
  EXPECT_EQ((*statuses)[0].jobs(0).min_clock(), 5);
  EXPECT_EQ((*statuses)[0].address(), *address);
  auto cps = (*client)->Checkpoint();
  ASSERT_TRUE(cps.ok()) << cps.status();
  struct stat st;
  EXPECT_EQ(stat((*cps)[0].path().c_str(), &st), 0) << (*cps)[0].path();
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), (*cps)[0].bytes());
  EXPECT_EQ((*cps)[0].path().rfind(ckpt, 0), 0u) << "under --checkpoint_dir";

  EXPECT_EQ(d.Signal(SIGTERM), 0) << d.Log();
}

// The limit on open files, soft and hard, of process `pid`, from /proc.
std::pair<std::string, std::string> OpenFilesLimit(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/limits");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Max open files", 0) != 0) continue;
    std::istringstream in(line.substr(14));
    std::string soft, hard;
    in >> soft >> hard;
    return {soft, hard};
  }
  return {"", ""};
}

TEST(PsServerBinaryTest, RaisesItsLimitOnOpenFilesToTheHardLimit) {
  // A disk tier keeps all its table files open (server/row_store.cc).
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max <= 256) {
    GTEST_SKIP() << "the hard limit on open files is " << saved.rlim_max;
  }
  struct rlimit low = saved;
  low.rlim_cur = 256;  // Inherited by the server started below.
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  const std::string port_file = Tmp("nofile.port");
  Daemon d(kBinary, {"--port_file=" + port_file, "--log_level=warn"}, Tmp("nofile.log"));
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_TRUE(d.WaitForPortFile(port_file).ok()) << d.Log();
  const auto [soft, hard] = OpenFilesLimit(d.pid());
  EXPECT_NE(soft, "256");
  EXPECT_EQ(soft, hard) << d.Log();
  EXPECT_EQ(d.Signal(SIGTERM), 0) << d.Log();
}

TEST(PsServerBinaryTest, ExitsRetryableWhenTheSchedulerCannotBeReached) {
  // Port 1 on loopback: nothing listens there.
  const std::string port_file = Tmp("noreg.port");
  Daemon d(kBinary,
           {"--port_file=" + port_file, "--scheduler=127.0.0.1:1", "--register_timeout_sec=1"},
           Tmp("noreg.log"));
  EXPECT_EQ(d.Wait(absl::Seconds(20)), 138) << d.Log();
  EXPECT_NE(d.Log().find("--scheduler 127.0.0.1:1"), std::string::npos) << d.Log();
  struct stat st;
  EXPECT_NE(stat(port_file.c_str(), &st), 0) << "no port file without registration";
}

TEST(PsServerBinaryTest, RefusesBadFlagsNamingThem) {
  Daemon d(kBinary, {"--log_level=loud"}, Tmp("badflag.log"));
  EXPECT_EQ(d.Wait(absl::Seconds(20)), 2);
  EXPECT_NE(d.Log().find("--log_level"), std::string::npos) << d.Log();
  Daemon busy(kBinary, {"--listen=256.1.1.1:0"}, Tmp("badlisten.log"));
  EXPECT_EQ(busy.Wait(absl::Seconds(20)), 1);
  EXPECT_NE(busy.Log().find("256.1.1.1:0"), std::string::npos) << busy.Log();
  Daemon port(kBinary, {"--data_port=70000"}, Tmp("baddataport.log"));
  EXPECT_EQ(port.Wait(absl::Seconds(20)), 2);
  EXPECT_NE(port.Log().find("--data_port"), std::string::npos) << port.Log();
  // A data port another process holds: the daemon says which flag, and exits.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  Daemon taken(kBinary, {"--data_port=" + std::to_string(ntohs(a.sin_port))},
               Tmp("takendataport.log"));
  EXPECT_EQ(taken.Wait(absl::Seconds(20)), 1);
  EXPECT_NE(taken.Log().find("--data_port"), std::string::npos) << taken.Log();
  close(fd);
}

// A scheduler that records what the server tells it.
class RecordingScheduler final : public v1::Scheduler::Service {
 public:
  grpc::Status RegisterNode(grpc::ServerContext*, const v1::RegisterNodeRequest* req,
                            v1::RegisterNodeResponse* resp) override {
    registrations++;
    last_node = req->node();
    resp->set_node_id(req->node().node_id().empty() ? "srv-7" : req->node().node_id());
    resp->set_lease_ms(3000);
    resp->set_heartbeat_interval_ms(50);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    if (heartbeats++ == 2) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown node");  // Scheduler restarted.
    }
    if (req->node_id() != "srv-7") bad_ids++;
    resp->set_lease_ms(3000);
    return grpc::Status::OK;
  }
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest* req,
                          v1::DeregisterResponse*) override {
    if (req->node_id() == "srv-7") deregistered++;
    return grpc::Status::OK;
  }
  std::atomic<int> registrations{0}, heartbeats{0}, bad_ids{0}, deregistered{0};
  v1::NodeInfo last_node;
};

TEST(PsServerBinaryTest, RegistersHeartbeatsAndDeregisters) {
  RecordingScheduler sched;
  auto server = GrpcServer::Start({}, {&sched});
  ASSERT_TRUE(server.ok());
  const std::string port_file = Tmp("reg.port");
  Daemon d(kBinary,
           {"--port_file=" + port_file, "--scheduler=" + (*server)->address(),
            "--memory_bytes=123456789"},
           Tmp("reg.log"));
  auto address = d.WaitForPortFile(port_file);
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(sched.registrations.load(), 1);
  EXPECT_EQ(sched.last_node.role(), v1::ROLE_SERVER);
  EXPECT_EQ(sched.last_node.address(), *address);
  EXPECT_EQ(sched.last_node.capacity().memory_bytes(), 123456789u);
  for (int i = 0; i < 200 && sched.heartbeats.load() < 5; ++i) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_GE(sched.heartbeats.load(), 5);
  EXPECT_EQ(sched.registrations.load(), 2) << "re-registered after NOT_FOUND";
  EXPECT_EQ(sched.last_node.node_id(), "srv-7") << "re-registration keeps the node id";
  EXPECT_EQ(sched.bad_ids.load(), 0);
  auto stub = v1::ParameterServer::NewStub(*MakeChannel(*address));
  v1::ServerStatusRequest sreq;
  v1::ServerStatus sresp;
  auto ctx = CallContext(absl::Seconds(5));
  ASSERT_TRUE(stub->Status(ctx.get(), sreq, &sresp).ok());
  EXPECT_EQ(sresp.node_id(), "srv-7");
  EXPECT_EQ(d.Signal(SIGTERM), 0) << d.Log();
  EXPECT_EQ(sched.deregistered.load(), 1);
}

// On a multi-host cluster the server listens on all interfaces and tells the scheduler the host
// others reach it at.
TEST(PsServerBinaryTest, AdvertisesTheGivenHost) {
  RecordingScheduler sched;
  auto server = GrpcServer::Start({}, {&sched});
  ASSERT_TRUE(server.ok());
  const std::string port_file = Tmp("adv.port");
  Daemon d(kBinary,
           {"--listen=0.0.0.0:0", "--advertise_host=localhost", "--port_file=" + port_file,
            "--scheduler=" + (*server)->address()},
           Tmp("adv.log"));
  auto address = d.WaitForPortFile(port_file);
  ASSERT_TRUE(address.ok()) << address.status();
  std::string port = address->substr(address->rfind(':') + 1);
  EXPECT_EQ(sched.last_node.address(), "localhost:" + port);
  EXPECT_EQ(d.Signal(SIGTERM), 0) << d.Log();
}

}  // namespace
}  // namespace pscluster
