// The scheduler under mutual TLS with a token file: a caller without a token is identified by
// its client certificate (subject alternative name, else common name) and gets the roles of that
// identity's line; a token, when sent, wins; a certificate without a line is refused; a refused
// call changes nothing. Certificates are made at test time with the openssl CLI.
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/channel.h"
#include "common/token_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/psctl/client.h"
#include "scheduler/scheduler_daemon.h"
#include "common/testing/status_matchers.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

bool Shell(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

// A certificate for `name` (CN) with `san` (may be empty), signed by the test CA in `dir`.
bool MakeCert(const std::string& dir, const std::string& name, const std::string& san) {
  const std::string base = absl::StrCat(dir, "/", name);
  if (!san.empty()) std::ofstream(base + ".ext") << "subjectAltName=" << san << "\n";
  return Shell(absl::StrCat("openssl req -newkey rsa:2048 -nodes -subj /CN=", name, " -keyout ",
                            base, ".key -out ", base, ".csr")) &&
         Shell(absl::StrCat("openssl x509 -req -in ", base, ".csr -CA ", dir, "/ca.pem -CAkey ",
                            dir, "/ca.key -CAcreateserial -days 1 -out ", base, ".pem",
                            san.empty() ? "" : absl::StrCat(" -extfile ", base, ".ext")));
}

class SchedulerAuthzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::getenv("TEST_TMPDIR");
    if (!Shell(absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca "
                            "-keyout ",
                            dir_, "/ca.key -out ", dir_, "/ca.pem")) ||
        !MakeCert(dir_, "localhost", "DNS:localhost,IP:127.0.0.1") ||
        !MakeCert(dir_, "vera", "DNS:vera.pscluster") || !MakeCert(dir_, "stranger", "")) {
      GTEST_SKIP() << "openssl CLI not available";
    }
    std::ofstream(dir_ + "/tokens") << "# test identities\n"
                                    << "- vera.pscluster viewer\n"
                                    << Sha256Hex("alice-token") << " alice admin\n";
    SchedulerDaemonOptions o;
    o.listen_address = "127.0.0.1:0";
    o.db_path = dir_ + "/authz.db";
    o.db_full_sync = false;
    o.tls = {dir_ + "/localhost.pem", dir_ + "/localhost.key", dir_ + "/ca.pem"};
    o.token_file = dir_ + "/tokens";
    o.audit_log = dir_ + "/audit-" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".log";
    audit_log_ = o.audit_log;
    auto d = SchedulerDaemon::Start(o);
    ASSERT_THAT(d, IsOk());
    daemon_ = std::move(*d);
  }

  std::unique_ptr<psctl::SchedulerClient> Client(const std::string& cert,
                                                 const std::string& token = "") {
    psctl::ClientOptions c;
    c.address = daemon_->address();
    c.timeout = absl::Seconds(5);
    c.channel.tls = {dir_ + "/" + cert + ".pem", dir_ + "/" + cert + ".key", dir_ + "/ca.pem"};
    c.channel.tls_server_name = "localhost";
    c.channel.bearer_token = token;
    auto client = psctl::SchedulerClient::Connect(c);
    EXPECT_THAT(client, IsOk());
    return std::move(*client);
  }

  std::string dir_;
  std::string audit_log_;
  std::unique_ptr<SchedulerDaemon> daemon_;
};

TEST_F(SchedulerAuthzTest, ACertificatesIdentityGetsTheRolesOfItsLine) {
  auto vera = Client("vera");
  EXPECT_THAT(vera->ListJobs(true), IsOk());
  EXPECT_THAT(vera->ClusterStatus(""), IsOk());
  EXPECT_THAT(vera->CancelJob("job-1", "no"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("CancelJob needs role admin; 'vera.pscluster' has viewer")));
  v1::SubmitJobRequest req;
  req.set_yaml("name: refused\n");
  EXPECT_THAT(vera->SubmitJob(req), StatusIs(absl::StatusCode::kPermissionDenied,
                                             HasSubstr("SubmitJob needs role admin")));
  // Refused before any effect: no job was queued.
  auto jobs = vera->ListJobs(true);
  ASSERT_THAT(jobs, IsOk());
  EXPECT_EQ(jobs->jobs_size(), 0);
}

TEST_F(SchedulerAuthzTest, ATokenWinsOverTheCertificate) {
  auto as_alice = Client("vera", "alice-token");
  // Past authorization: the job simply does not exist.
  EXPECT_THAT(as_alice->CancelJob("job-404", "test"), StatusIs(absl::StatusCode::kNotFound));
  auto wrong = Client("vera", "not-a-token");
  EXPECT_THAT(wrong->ListJobs(true), StatusIs(absl::StatusCode::kUnauthenticated));
}

// --audit_log: a line per call that changes state (allowed or not) and per refused call, with
// who made it; reads that pass are not logged.
TEST_F(SchedulerAuthzTest, TheAuditLogRecordsChangesAndRefusalsWithTheirCaller) {
  auto vera = Client("vera");
  EXPECT_THAT(vera->ListJobs(true), IsOk());  // A read: not logged.
  EXPECT_THAT(vera->CancelJob("job-1", "no"), StatusIs(absl::StatusCode::kPermissionDenied));
  auto as_alice = Client("vera", "alice-token");
  EXPECT_THAT(as_alice->CancelJob("job-404", "test"), StatusIs(absl::StatusCode::kNotFound));
  auto wrong = Client("vera", "not-a-token");
  EXPECT_THAT(wrong->ListJobs(true), StatusIs(absl::StatusCode::kUnauthenticated));

  std::ifstream in(audit_log_);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u) << absl::StrJoin(lines, "\n");
  EXPECT_THAT(lines[0], HasSubstr("\"method\":\"pscluster.v1.Scheduler.CancelJob\","
                                  "\"identity\":\"vera.pscluster\""));
  EXPECT_THAT(lines[0], HasSubstr("\"code\":\"PERMISSION_DENIED\""));
  EXPECT_THAT(lines[1], HasSubstr("\"identity\":\"alice\""));
  EXPECT_THAT(lines[1], HasSubstr("\"job_id\":\"job-404\",\"code\":\"NOT_FOUND\""));
  EXPECT_THAT(lines[2], HasSubstr("\"method\":\"pscluster.v1.Scheduler.ListJobs\","
                                  "\"identity\":\"\""));
  EXPECT_THAT(lines[2], HasSubstr("\"code\":\"UNAUTHENTICATED\""));
  EXPECT_THAT(lines[2], HasSubstr("\"peer\":\"ipv4:127.0.0.1:"));

  // The same calls counted by method and answer in /metrics.
  const std::string page = daemon_->scheduler().metrics().Render();
  EXPECT_THAT(page, HasSubstr("# TYPE pscluster_scheduler_audit_calls_total counter"));
  EXPECT_THAT(page, HasSubstr("pscluster_scheduler_audit_calls_total{method=\"CancelJob\","
                              "code=\"PERMISSION_DENIED\"} 1"));
  EXPECT_THAT(page, HasSubstr("pscluster_scheduler_audit_calls_total{method=\"CancelJob\","
                              "code=\"NOT_FOUND\"} 1"));
  EXPECT_THAT(page, HasSubstr("pscluster_scheduler_audit_calls_total{method=\"ListJobs\","
                              "code=\"UNAUTHENTICATED\"} 1"));
  EXPECT_THAT(page, Not(HasSubstr("method=\"ListJobs\",code=\"OK\"")));
}

TEST_F(SchedulerAuthzTest, ACertificateWithoutALineIsRefused) {
  auto stranger = Client("stranger");
  EXPECT_THAT(stranger->ListJobs(true),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("stranger")));
}

}  // namespace
}  // namespace pscluster::scheduler

namespace pscluster::scheduler {
namespace {

// A plaintext scheduler on a free loopback port, its database `db` in the test's directory.
SchedulerDaemonOptions PlaintextOptions(const std::string& db) {
  SchedulerDaemonOptions o;
  o.listen_address = "127.0.0.1:0";
  o.db_path = std::string(std::getenv("TEST_TMPDIR")) + "/" + db;
  o.db_full_sync = false;
  return o;
}

// Malformed and hostile authorization headers over plaintext: each one is UNAUTHENTICATED, none
// has an effect, and the scheduler keeps serving the good token.
TEST(SchedulerAuthzPlaintextTest, BadAuthorizationHeadersAreUnauthenticated) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  std::ofstream(dir + "/plain-tokens") << Sha256Hex("good-token") << " alice admin\n";
  SchedulerDaemonOptions o = PlaintextOptions("plain.db");
  o.token_file = dir + "/plain-tokens";
  auto d = SchedulerDaemon::Start(o);
  ASSERT_THAT(d, IsOk());
  auto channel = MakeChannel((*d)->address());
  ASSERT_THAT(channel, IsOk());
  auto stub = v1::Scheduler::NewStub(*channel);
  const std::string headers[] = {
      "",
      "Bearer",
      "Bearer ",
      "Basic Z29vZC10b2tlbg==",
      "good-token",
      "Bearer good-token ",
      "Bearer  good-token",
      "Bearer GOOD-TOKEN",
      "Bearer " + std::string(4000, 'a'),
  };
  for (const std::string& h : headers) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.AddMetadata("authorization", h);
    v1::SubmitJobRequest req;
    req.set_yaml("name: hostile\n");
    v1::SubmitJobResponse resp;
    grpc::Status s = stub->SubmitJob(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << h.substr(0, 40) << ": " << s.error_message();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ctx.set_wait_for_ready(true);
  ctx.AddMetadata("authorization", "Bearer good-token");
  v1::ListJobsRequest list;
  list.set_include_finished(true);
  v1::ListJobsResponse jobs;
  grpc::Status s = stub->ListJobs(&ctx, list, &jobs);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(jobs.jobs_size(), 0);
}

// --quota_file over gRPC: the submitter is the identity of its token, and its quota (not
// another identity's) decides; the quotas are read again by ReloadQuotas (SIGHUP).
TEST(SchedulerQuotaTest, TheCallersIdentityIsCheckedAgainstItsQuota) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  std::ofstream(dir + "/quota-tokens") << Sha256Hex("alice-token") << " alice admin\n"
                                       << Sha256Hex("carl-token") << " carl admin\n"
                                       << Sha256Hex("node-token") << " agent node\n";
  std::ofstream(dir + "/quotas") << "# identity jobs server_memory\nalice 1 -\n";
  SchedulerDaemonOptions o = PlaintextOptions("quota.db");
  o.token_file = dir + "/quota-tokens";
  o.quota_file = dir + "/quotas";
  // The nodes below are never there: a refused placement is retried only after the test.
  o.scheduler.placement_backoff = absl::Hours(1);
  auto d = SchedulerDaemon::Start(o);
  ASSERT_THAT(d, IsOk());
  auto channel = MakeChannel((*d)->address());
  ASSERT_THAT(channel, IsOk());
  auto stub = v1::Scheduler::NewStub(*channel);
  auto call = [&](const std::string& token, auto method, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.AddMetadata("authorization", "Bearer " + token);
    return (stub.get()->*method)(&ctx, req, resp);
  };
  // A server and a worker, so that a job of one each may be queued.
  for (v1::NodeRole role : {v1::ROLE_SERVER, v1::ROLE_WORKER}) {
    v1::RegisterNodeRequest reg;
    reg.mutable_node()->set_role(role);
    reg.mutable_node()->set_address(role == v1::ROLE_SERVER ? "127.0.0.1:1" : "127.0.0.1:2");
    reg.mutable_node()->mutable_capacity()->set_cpu_slots(1);
    reg.mutable_node()->mutable_capacity()->set_memory_bytes(uint64_t{1} << 30);
    reg.mutable_node()->set_pid(4242);
    v1::RegisterNodeResponse registered;
    grpc::Status s = call("node-token", &v1::Scheduler::Stub::RegisterNode, reg, &registered);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  v1::SubmitJobRequest req;
  req.set_yaml(R"(name: quota
model: {kind: mlp, hidden: [8]}
dataset: {name: fashion_mnist}
optimizer: {kind: sgd, learning_rate: 0.1}
num_servers: 1
num_workers: 1
epochs: 1
batch_size: 10
)");
  v1::SubmitJobResponse resp;
  grpc::Status s = call("alice-token", &v1::Scheduler::Stub::SubmitJob, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::string first = resp.job_id();
  s = call("alice-token", &v1::Scheduler::Stub::SubmitJob, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr(absl::StrCat("quota: identity 'alice' may have at most 1 unfinished "
                                     "jobs (--quota_file ",
                                     dir, "/quotas:2); it has 1: ", first)));
  // carl has no line and no default: no quota.
  s = call("carl-token", &v1::Scheduler::Stub::SubmitJob, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();

  // A raised quota, read again.
  std::ofstream(dir + "/quotas") << "alice 2 -\n";
  ASSERT_THAT((*d)->ReloadQuotas(), IsOk());
  s = call("alice-token", &v1::Scheduler::Stub::SubmitJob, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  // A broken file is refused and the quotas in force stay.
  std::ofstream(dir + "/quotas") << "alice lots -\n";
  EXPECT_THAT((*d)->ReloadQuotas(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/quotas:1: jobs")));
  s = call("alice-token", &v1::Scheduler::Stub::SubmitJob, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
}

TEST(SchedulerQuotaTest, AQuotaFileNeedsATokenFileAndMustParse) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  std::ofstream(dir + "/q-ok") << "* 3 1GiB\n";
  std::ofstream(dir + "/q-bad") << "alice 1\n";
  std::ofstream(dir + "/q-tokens") << Sha256Hex("alice-token") << " alice admin\n";
  SchedulerDaemonOptions o = PlaintextOptions("q.db");
  o.quota_file = dir + "/q-ok";
  EXPECT_THAT(SchedulerDaemon::Start(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  HasSubstr("--quota_file: quotas are per "
                                                            "identity and need --token_file")));
  o.token_file = dir + "/q-tokens";
  o.quota_file = dir + "/q-bad";
  EXPECT_THAT(SchedulerDaemon::Start(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("--quota_file ", dir, "/q-bad:1: expected"))));
  o.quota_file = dir + "/q-missing";
  EXPECT_THAT(SchedulerDaemon::Start(o), StatusIs(absl::StatusCode::kNotFound,
                                                  HasSubstr("--quota_file")));
  o.quota_file = dir + "/q-ok";
  EXPECT_THAT(SchedulerDaemon::Start(o), IsOk());
}

}  // namespace
}  // namespace pscluster::scheduler
