// The highly available scheduler secured end to end: etcd run with TLS and client certificates
// (--client-cert-auth), reached only with the CA and a certificate it trusts; two schedulers
// speaking TLS on their own port and checking bearer tokens elect one leader through that
// etcd, the follower refuses writes naming the leader, checks credentials as the leader does,
// asks the leader for ClusterStatus with the caller's token, and the follower takes over, with the state read back from the TLS etcd, when the
// leader goes. Certificates are made with the openssl CLI (tests/integration/make_certs.sh).
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/testing/http_get.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait_for.h"
#include "common/token_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/etcd_client.h"
#include "scheduler/ha_scheduler.h"
#include "scheduler/psctl/subprocess.h"
#include "scheduler/testing/etcd_cluster.h"
#include "tests/integration/test_certs.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::HttpGet;
using ::pscluster::testing::IsOk;
using ::pscluster::testing::WaitFor;
using ::testing::HasSubstr;

constexpr char kAdminToken[] = "admin-token-for-the-ha-tls-test";
constexpr char kViewerToken[] = "viewer-token-for-the-ha-tls-test";

constexpr char kJob[] = R"(name: tls-job
model: {kind: mlp, hidden: [8]}
dataset: {name: fashion_mnist}
optimizer: {kind: sgd, learning_rate: 0.1}
num_servers: 1
num_workers: 1
epochs: 1
batch_size: 10
export_path: /tmp/m.safetensors
)";

class HaTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    certs_ = pscluster::testing::MakeTestCerts();
    ASSERT_FALSE(certs_.empty());
    dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/ha-tls");
    ASSERT_EQ(std::system(absl::StrCat("rm -rf '", dir_, "' && mkdir -p '", dir_, "'").c_str()),
              0);
    tls_.cert = Cert("server.pem");
    tls_.key = Cert("server.key");
    tls_.client_ca = Cert("ca.pem");
    tls_.client = Client();
    auto etcd = testing::EtcdCluster::Start(dir_, 1, absl::Seconds(60), &tls_);
    ASSERT_THAT(etcd, IsOk());
    etcd_ = std::move(*etcd);
  }

  std::string Cert(const std::string& name) const { return absl::StrCat(certs_, "/", name); }
  // The CA that signed etcd's certificate and a client certificate it trusts.
  TlsFiles Client() const { return TlsFiles{Cert("client.pem"), Cert("client.key"), Cert("ca.pem")}; }

  absl::Status PutThrough(const TlsFiles& tls) {
    auto c = EtcdClient::Connect(etcd_->endpoints(), absl::Seconds(2), tls);
    if (!c.ok()) return c.status();
    return (*c)->Put("/ha-tls-test/key", "value");
  }

  std::unique_ptr<HaScheduler> StartScheduler() {
    std::ofstream(dir_ + "/tokens") << Sha256Hex(kAdminToken) << " alice admin\n"
                                    << Sha256Hex(kViewerToken) << " victor viewer\n";
    SchedulerDaemonOptions d;
    d.listen_address = "127.0.0.1:0";
    // Mutual TLS (a follower also calls the leader, as a client, presenting node.pem); callers
    // prove who they are by token.
    d.tls.cert = Cert("node.pem");
    d.tls.key = Cert("node.key");
    d.tls.ca = Cert("ca.pem");
    d.token_file = dir_ + "/tokens";
    d.http_address = "127.0.0.1:0";
    HaOptions ha;
    ha.etcd_endpoints = etcd_->endpoints();
    ha.lease_seconds = 2;
    ha.etcd_tls = Client();
    auto h = HaScheduler::Start(d, ha);
    EXPECT_THAT(h, IsOk());
    return h.ok() ? std::move(*h) : nullptr;
  }

  std::unique_ptr<v1::Scheduler::Stub> Stub(const HaScheduler& h, const std::string& token) {
    ChannelOptions o;
    o.tls = TlsFiles{Cert("client.pem"), Cert("client.key"), Cert("ca.pem")};
    o.bearer_token = token;
    auto channel = MakeChannel(h.address(), o);
    EXPECT_THAT(channel, IsOk());
    return v1::Scheduler::NewStub(*channel);
  }

  static grpc::Status Submit(v1::Scheduler::Stub* stub, std::string* id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SubmitJobRequest req;
    req.set_yaml(kJob);
    req.set_source("job.yaml");
    v1::SubmitJobResponse resp;
    grpc::Status s = stub->SubmitJob(&ctx, req, &resp);
    if (id != nullptr) *id = resp.job_id();
    return s;
  }
  static grpc::Status Status(v1::Scheduler::Stub* stub, v1::ClusterStatusResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub->ClusterStatus(&ctx, v1::ClusterStatusRequest(), resp);
  }
  static grpc::Status List(v1::Scheduler::Stub* stub, v1::ListJobsResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub->ListJobs(&ctx, v1::ListJobsRequest(), resp);
  }

  std::string certs_, dir_;
  testing::EtcdTls tls_;
  std::unique_ptr<testing::EtcdCluster> etcd_;
};

TEST_F(HaTlsTest, EtcdWithClientCertificatesIsReachedOnlyWithATrustedCertificate) {
  EXPECT_THAT(PutThrough(Client()), IsOk());
  auto c = EtcdClient::Connect(etcd_->endpoints(), absl::Seconds(2), Client());
  ASSERT_THAT(c, IsOk());
  auto kv = (*c)->Get("/ha-tls-test/key");
  ASSERT_THAT(kv, IsOk());
  EXPECT_EQ(kv->value(), "value");

  // No client certificate, an untrusted one, no TLS, or a CA that does not sign etcd's: the
  // call fails, naming the endpoints.
  const std::vector<std::pair<std::string, TlsFiles>> refused = {
      {"no client certificate", TlsFiles{"", "", Cert("ca.pem")}},
      {"a certificate of another CA",
       TlsFiles{Cert("other-client.pem"), Cert("other-client.key"), Cert("ca.pem")}},
      {"plain gRPC", TlsFiles{}},
      {"a CA that did not sign etcd's certificate",
       TlsFiles{Cert("client.pem"), Cert("client.key"), Cert("other-ca.pem")}},
  };
  for (const auto& [what, tls] : refused) {
    absl::Status st = PutThrough(tls);
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << what << ": " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(etcd_->endpoints())) << what;
  }

  // Files that cannot be used are named by their flag before anything is dialed.
  absl::Status half = PutThrough(TlsFiles{Cert("client.pem"), "", Cert("ca.pem")});
  EXPECT_EQ(half.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(half.message()),
              HasSubstr("--etcd_cert_file and --etcd_key_file must be given together"));
  absl::Status missing = PutThrough(TlsFiles{"", "", dir_ + "/no-such-ca.pem"});
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("--etcd_ca_file: cannot read"));
}

TEST_F(HaTlsTest, SchedulersInTlsWithTokensElectOneLeaderThroughTlsEtcd) {
  std::unique_ptr<HaScheduler> a = StartScheduler();
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(WaitFor(absl::Seconds(20), [&] { return a->leading(); }));
  std::unique_ptr<HaScheduler> b = StartScheduler();
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(WaitFor(absl::Seconds(20), [&] { return b->leader() == a->address(); }));
  EXPECT_FALSE(b->leading());

  // The leader: an admin submits; a viewer may not; no token is no credential.
  std::string id;
  grpc::Status s = Submit(Stub(*a, kAdminToken).get(), &id);
  ASSERT_TRUE(s.ok()) << s.error_message();
  s = Submit(Stub(*a, kViewerToken).get(), nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("needs role admin"));

  // The follower checks credentials as the leader does, serves reads from the TLS etcd and
  // refuses writes naming the leader.
  v1::ListJobsResponse jobs;
  s = List(Stub(*b, "").get(), &jobs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("has no line in this daemon's token file"))
      << "a client certificate alone names an identity the token file lacks";
  ASSERT_TRUE(WaitFor(absl::Seconds(5), [&] {
    jobs.Clear();
    return List(Stub(*b, kViewerToken).get(), &jobs).ok() && jobs.jobs_size() == 1;
  }));
  EXPECT_EQ(jobs.jobs(0).job_id(), id);
  s = Submit(Stub(*b, kAdminToken).get(), nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("the leader is at ", a->address())));
  // ClusterStatus is the leader's (it knows the nodes' liveness): the follower asks it, in TLS,
  // with the caller's token, which the leader checks again.
  v1::ClusterStatusResponse status;
  s = Status(Stub(*b, kViewerToken).get(), &status);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).job_id(), id);
  s = Status(Stub(*b, "").get(), &status);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  // Its status page likewise: the caller's token checked here, then by the leader.
  ASSERT_NE(b->http_port(), 0);
  EXPECT_THAT(HttpGet(b->http_port(), "/api/jobs"), HasSubstr("401"));
  EXPECT_THAT(HttpGet(b->http_port(), "/api/jobs", "not-a-token"), HasSubstr("401"));
  EXPECT_THAT(HttpGet(b->http_port(), "/api/jobs", kViewerToken),
              HasSubstr(absl::StrCat("\"job_id\":\"", id, "\"")));

  // The leader goes: the follower takes over with the job it reads back from etcd.
  a->Shutdown();
  a.reset();
  ASSERT_TRUE(WaitFor(absl::Seconds(20), [&] { return b->leading(); }));
  s = Status(Stub(*b, kViewerToken).get(), &status);
  EXPECT_TRUE(s.ok()) << "its own now: " << s.error_message();
  ASSERT_TRUE(WaitFor(absl::Seconds(10), [&] {
    jobs.Clear();
    return List(Stub(*b, kViewerToken).get(), &jobs).ok() && jobs.jobs_size() == 1;
  }));
  EXPECT_EQ(jobs.jobs(0).job_id(), id);
  std::string second;
  s = Submit(Stub(*b, kAdminToken).get(), &second);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(second, id);
}

// The daemon itself: ps_scheduler given --etcd_ca_file, --etcd_cert_file and --etcd_key_file
// leads through the TLS etcd and takes a submission (the flags reach the etcd client).
TEST_F(HaTlsTest, TheSchedulerBinaryReachesTlsEtcdWithItsEtcdFlags) {
  std::ofstream(dir_ + "/tokens") << Sha256Hex(kAdminToken) << " alice admin\n";
  const std::string port_file = dir_ + "/scheduler.port";
  psctl::SpawnOptions o;
  o.binary = absl::StrCat(std::getenv("TEST_SRCDIR"), "/pscluster/scheduler/ps_scheduler");
  o.log_file = dir_ + "/scheduler.log";
  o.args = {"--listen=127.0.0.1:0",
            absl::StrCat("--port_file=", port_file),
            absl::StrCat("--etcd_endpoints=", etcd_->endpoints()),
            "--etcd_lease_seconds=2",
            absl::StrCat("--etcd_ca_file=", Cert("ca.pem")),
            absl::StrCat("--etcd_cert_file=", Cert("client.pem")),
            absl::StrCat("--etcd_key_file=", Cert("client.key")),
            absl::StrCat("--tls_cert=", Cert("node.pem")),
            absl::StrCat("--tls_key=", Cert("node.key")),
            absl::StrCat("--tls_ca=", Cert("ca.pem")),
            absl::StrCat("--token_file=", dir_, "/tokens")};
  auto p = psctl::Subprocess::Spawn(o);
  ASSERT_THAT(p, IsOk());
  std::string address;
  auto log = [&] {
    std::ifstream in(dir_ + "/scheduler.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    std::ifstream in(port_file);
    return static_cast<bool>(std::getline(in, address)) && !address.empty();
  })) << log();
  ChannelOptions co;
  co.tls = Client();
  co.bearer_token = kAdminToken;
  auto channel = MakeChannel(address, co);
  ASSERT_THAT(channel, IsOk());
  auto stub = v1::Scheduler::NewStub(*channel);
  grpc::Status s;
  EXPECT_TRUE(WaitFor(absl::Seconds(20), [&] {
    s = Submit(stub.get(), nullptr);
    return s.ok();
  })) << s.error_message() << "\n" << log();
  EXPECT_NE(log().find("leading (term"), std::string::npos) << log();
}

}  // namespace
}  // namespace pscluster::scheduler
