// The web status page and its JSON, served by a whole scheduler daemon (port 0) that stand-in
// servers and workers train a job on: every endpoint, its errors, and the viewer-token check.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/token_file.h"
#include "scheduler/scheduler_daemon.h"
#include "scheduler/testing/fake_nodes.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::scheduler::testing::FakeNode;
using ::pscluster::scheduler::testing::FakeNodeOptions;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kJob[] = R"(name: page-job
model: {kind: mlp, hidden: [8]}
dataset: {name: fashion_mnist}
optimizer: {kind: adam, learning_rate: 0.001}
consistency: {mode: bsp}
num_servers: 2
num_workers: 2
epochs: 1
batch_size: 16
num_virtual_shards: 8
)";

std::string HttpGet(int port, const std::string& path, const std::string& headers = "",
                    const std::string& method = "GET") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  std::string req = method + " " + path + " HTTP/1.0\r\n" + headers + "\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

class StatusHttpTest : public ::testing::Test {
 protected:
  void Start(const std::string& token_file = "") {
    std::string db = absl::StrCat(::testing::TempDir(), "/",
                                  ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                                  ".db");
    std::remove(db.c_str());
    SchedulerDaemonOptions o;
    o.listen_address = "127.0.0.1:0";
    o.http_address = "127.0.0.1:0";
    o.db_path = db;
    o.db_full_sync = false;
    o.token_file = token_file;
    o.scheduler.lease = absl::Milliseconds(2000);
    o.scheduler.tick = absl::Milliseconds(20);
    o.scheduler.startup_grace = absl::Milliseconds(1);
    auto d = SchedulerDaemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    ASSERT_GT(daemon_->http_port(), 0);
  }
  void AddNodes() {
    for (int i = 0; i < 4; ++i) {
      FakeNodeOptions o;
      o.role = i < 2 ? v1::ROLE_SERVER : v1::ROLE_WORKER;
      o.scheduler_address = daemon_->address();
      o.heartbeat_interval = absl::Milliseconds(50);
      o.capacity.set_cpu_slots(1);
      o.training.total_steps = 30;
      o.training.report_every = 3;
      o.training.test_accuracy = 0.75;
      auto n = FakeNode::Start(o);
      ASSERT_TRUE(n.ok()) << n.status();
      ASSERT_TRUE((*n)->WaitRegistered(absl::Seconds(5)));
      nodes_.push_back(std::move(*n));
    }
  }
  // Submits kJob straight to the handler and waits (bounded) for it to succeed.
  void TrainJob() {
    v1::SubmitJobRequest req;
    req.set_yaml(kJob);
    v1::SubmitJobResponse resp;
    ASSERT_TRUE(daemon_->scheduler().SubmitJob(req, &resp).ok());
    v1::GetJobRequest get;
    get.set_job_id(resp.job_id());
    v1::Job job;
    for (int i = 0; i < 1000; ++i) {
      ASSERT_TRUE(daemon_->scheduler().GetJob(get, &job).ok());
      if (job.state() == v1::JOB_SUCCEEDED) return;
      absl::SleepFor(absl::Milliseconds(20));
    }
    FAIL() << "job did not succeed: " << job.DebugString();
  }
  std::string Get(const std::string& path, const std::string& headers = "") {
    return HttpGet(daemon_->http_port(), path, headers);
  }
  void TearDown() override {
    nodes_.clear();
    daemon_.reset();
  }

  std::unique_ptr<SchedulerDaemon> daemon_;
  std::vector<std::unique_ptr<FakeNode>> nodes_;
};

TEST_F(StatusHttpTest, ThePageIsSelfContained) {
  Start();
  std::string page = Get("/");
  EXPECT_THAT(page, StartsWith("HTTP/1.0 200 OK\r\n"));
  EXPECT_THAT(page, HasSubstr("Content-Type: text/html"));
  EXPECT_THAT(page, HasSubstr("Content-Security-Policy: default-src 'none'"));
  EXPECT_THAT(page, HasSubstr("<canvas id=\"loss-chart\""));
  EXPECT_THAT(page, HasSubstr("fetch(path"));
  // Nothing fetched from elsewhere: no URL with a scheme, no CDN.
  EXPECT_THAT(page, Not(HasSubstr("http://")));
  EXPECT_THAT(page, Not(HasSubstr("https://")));
  EXPECT_THAT(page, Not(HasSubstr("src=\"//")));
  EXPECT_THAT(Get("/index.html"), StartsWith("HTTP/1.0 200"));
  EXPECT_THAT(Get("/elsewhere"), StartsWith("HTTP/1.0 404"));
  EXPECT_THAT(HttpGet(daemon_->http_port(), "/api/jobs", "", "POST"), StartsWith("HTTP/1.0 405"));
}

TEST_F(StatusHttpTest, JsonOfJobsNodesAndOneJobWithItsHistory) {
  Start();
  AddNodes();
  TrainJob();
  std::string jobs = Get("/api/jobs");
  EXPECT_THAT(jobs, StartsWith("HTTP/1.0 200"));
  EXPECT_THAT(jobs, HasSubstr("Content-Type: application/json"));
  EXPECT_THAT(jobs, HasSubstr("\"job_id\":\"job-1\""));
  EXPECT_THAT(jobs, HasSubstr("\"state\":\"JOB_SUCCEEDED\""));
  EXPECT_THAT(jobs, Not(HasSubstr("\"points\"")));  // The list carries no history.

  std::string nodes = Get("/api/nodes");
  EXPECT_THAT(nodes, StartsWith("HTTP/1.0 200"));
  EXPECT_THAT(nodes, HasSubstr("\"role\":\"ROLE_SERVER\""));
  EXPECT_THAT(nodes, HasSubstr("\"state\":\"NODE_ALIVE\""));

  std::string job = Get("/api/jobs/job-1");
  EXPECT_THAT(job, StartsWith("HTTP/1.0 200"));
  EXPECT_THAT(job, HasSubstr("{\"job\": {\"job_id\":\"job-1\""));
  EXPECT_THAT(job, HasSubstr("\"points\":[{"));
  EXPECT_THAT(job, HasSubstr("\"kind\":\"JOB_EVENT_STATE\""));
  EXPECT_THAT(job, HasSubstr("\"shard_map\": {"));
  EXPECT_THAT(job, HasSubstr("\"num_virtual_shards\":8"));
  EXPECT_THAT(job, HasSubstr("\"test_accuracy\":0.75"));

  std::string unknown = Get("/api/jobs/job-9");
  EXPECT_THAT(unknown, StartsWith("HTTP/1.0 404"));
  EXPECT_THAT(unknown, HasSubstr("{\"error\": \"job_id: no job 'job-9'\"}"));
  EXPECT_THAT(Get("/api/jobs/%22%0a"), StartsWith("HTTP/1.0 404"));
  EXPECT_THAT(Get("/api/jobs/%22%0a"), HasSubstr("no job '\\\"\\n'"));  // Escaped JSON.
  EXPECT_THAT(Get("/api/whatever"), StartsWith("HTTP/1.0 404"));
}

TEST_F(StatusHttpTest, WithTokensTheJsonNeedsAViewerToken) {
  std::string path = ::testing::TempDir() + "/status_http_tokens";
  std::ofstream(path) << Sha256Hex("view-token") << " ops viewer\n"
                      << Sha256Hex("node-token") << " n1 node\n";
  Start(path);
  EXPECT_THAT(Get("/"), StartsWith("HTTP/1.0 200"));  // The page holds no data.
  std::string none = Get("/api/jobs");
  EXPECT_THAT(none, StartsWith("HTTP/1.0 401"));
  EXPECT_THAT(none, HasSubstr("WWW-Authenticate: Bearer"));
  EXPECT_THAT(Get("/api/jobs", "Authorization: Bearer wrong\r\n"), StartsWith("HTTP/1.0 401"));
  std::string node = Get("/api/nodes", "Authorization: Bearer node-token\r\n");
  EXPECT_THAT(node, StartsWith("HTTP/1.0 403"));
  EXPECT_THAT(node, HasSubstr("needs role admin or viewer"));
  EXPECT_THAT(Get("/api/jobs", "Authorization: Bearer view-token\r\n"),
              StartsWith("HTTP/1.0 200"));
  EXPECT_THAT(Get("/api/jobs/job-1", "Authorization: Bearer view-token\r\n"),
              StartsWith("HTTP/1.0 404"));
}

TEST(StatusHttpStartTest, PlainHttpBesideTlsOnlyOnLoopback) {
  SchedulerDaemonOptions o;
  o.listen_address = "127.0.0.1:0";
  o.db_path = ::testing::TempDir() + "/tls_http.db";
  o.http_address = "0.0.0.0:0";
  o.tls.cert = "/nonexistent/cert.pem";
  o.tls.key = "/nonexistent/key.pem";
  auto d = SchedulerDaemon::Start(o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("--http_listen: '0.0.0.0:0'"));
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("bind it to 127.0.0.1"));
  o.http_address = "bad";
  o.tls = {};
  d = SchedulerDaemon::Start(o);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("--http_listen: 'bad'"));
}

}  // namespace
}  // namespace pscluster::scheduler
