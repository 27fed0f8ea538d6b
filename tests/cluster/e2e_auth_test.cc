// End to end with the real daemons, secured: every daemon has a --token_file and sends its own
// token (--credential_file). A job submitted with an admin token trains to the end (the workers'
// data connections to the servers proving the job's data secret); a viewer can read but not cancel; a caller
// without a token is refused; a worker's token cannot drop a job on a server; health checking
// stays open; SIGHUP reloads the token file.
#include <signal.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/status_convert.h"
#include "common/token_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "tests/cluster/e2e_cluster.h"

namespace pscluster::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kAdmin[] = "admin-0b9c4e2f7a1d5e8c3b6a9f0d2e4c7b1a";
constexpr char kViewer[] = "viewer-5d2a8c1e4b7f0a3d6c9e2b5f8a1d4c7e";
constexpr char kScheduler[] = "scheduler-9e3b6d0a2c5f8e1b4d7a0c3f6e9b2d5a";
constexpr char kServer[] = "server-2f5a8d1c4e7b0a3f6d9c2e5b8a1f4d7c";
constexpr char kWorker[] = "worker-7c0e3a6d9b2f5c8e1a4d7b0f3c6e9a2d";
constexpr char kLateViewer[] = "late-viewer-4a7d0c3f6b9e2a5d8c1f4b7e0a3d6c9f";

std::string TokenLines() {
  return absl::StrCat("# identities of the test cluster\n",             //
                      Sha256Hex(kAdmin), " alice admin,viewer\n",       //
                      Sha256Hex(kViewer), " vera viewer\n",             //
                      Sha256Hex(kScheduler), " scheduler scheduler\n",  //
                      Sha256Hex(kServer), " servers server,node\n",     //
                      Sha256Hex(kWorker), " workers worker,node\n");
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

class E2eAuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TestDir("auth-files"));
    const std::string& d = *dir_;
    Write(d + "/tokens", TokenLines());
    Write(d + "/scheduler.token", absl::StrCat(kScheduler, "\n"));
    Write(d + "/server.token", absl::StrCat(kServer, "\n"));
    Write(d + "/worker.token", absl::StrCat(kWorker, "\n"));
    Write(d + "/viewer.token", absl::StrCat(kViewer, "\n"));
    Write(d + "/late.token", absl::StrCat(kLateViewer, "\n"));
    // alice (the admin) submits nothing once her running jobs hold 1 KiB on their servers.
    Write(d + "/quotas", "# identity jobs server_memory\nalice - 1KiB\n");
    E2eClusterOptions o;
    o.admin_token = kAdmin;
    const std::string tokens = "--token_file=" + d + "/tokens";
    o.scheduler_args = {tokens, "--credential_file=" + d + "/scheduler.token",
                        "--quota_file=" + d + "/quotas"};
    o.server_args = {tokens, "--credential_file=" + d + "/server.token"};
    o.worker_args = {tokens, "--credential_file=" + d + "/worker.token"};
    auto c = E2eCluster::Start("auth", o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

  // A Scheduler stub whose calls carry `token` ("" = none).
  static std::unique_ptr<v1::Scheduler::Stub> SchedulerStub(const std::string& token) {
    ChannelOptions co;
    co.bearer_token = token;
    auto ch = MakeChannel(cluster_->scheduler_address(), co);
    EXPECT_TRUE(ch.ok());
    return v1::Scheduler::NewStub(*ch);
  }
  static std::unique_ptr<v1::ParameterServer::Stub> ServerStub(
      const std::string& token, const std::string& server = "server-1") {
    ChannelOptions co;
    co.bearer_token = token;
    auto ch = MakeChannel(cluster_->processes().Address(server), co);
    EXPECT_TRUE(ch.ok());
    return v1::ParameterServer::NewStub(*ch);
  }

  static std::string* dir_;
  static E2eCluster* cluster_;
};

std::string* E2eAuthTest::dir_ = nullptr;
E2eCluster* E2eAuthTest::cluster_ = nullptr;

TEST_F(E2eAuthTest, AJobSubmittedWithAnAdminTokenTrainsToTheEnd) {
  E2eCluster& c = *cluster_;
  std::string job = c.WriteFile("job.yaml", FashionJobYaml("secured-mlp", 1, "", 32));
  CommandResult submit = c.Psctl({"submit", job, "--wait"}, absl::Seconds(150));
  ASSERT_EQ(submit.exit_code, 0) << submit.output << c.LogTails();
  EXPECT_THAT(submit.output, HasSubstr("succeeded"));
  auto done = c.GetJob("job-1");
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason();
  EXPECT_GE(done->progress().test_accuracy(), 0.7);
  auto st = c.ServerStatus("server-1");
  EXPECT_EQ(st.status().code(), absl::StatusCode::kUnauthenticated);
  // The workers' pulls and pushes went over the servers' data sockets, each connection proving
  // the job's data secret (not over gRPC).
  std::ifstream in(c.processes().LogFile("worker-1"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("data plane to"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("over gRPC"))) << text;
}

TEST_F(E2eAuthTest, AViewerCanListJobsButNotCancelThem) {
  E2eCluster& c = *cluster_;
  const std::string viewer = "--token_file=" + *dir_ + "/viewer.token";
  CommandResult jobs = c.Psctl({viewer, "jobs"});
  EXPECT_EQ(jobs.exit_code, 0) << jobs.output;
  CommandResult nodes = c.Psctl({viewer, "nodes"});
  EXPECT_EQ(nodes.exit_code, 0) << nodes.output;
  CommandResult cancel = c.Psctl({viewer, "cancel", "job-1"});
  EXPECT_EQ(cancel.exit_code, 1) << cancel.output;
  EXPECT_THAT(cancel.output, HasSubstr("CancelJob needs role admin; 'vera' has viewer"));

  auto stub = SchedulerStub(kViewer);
  v1::CancelJobRequest req;
  req.set_job_id("job-1");
  v1::CancelJobResponse resp;
  auto ctx = CallContext(absl::Seconds(5));
  grpc::Status s = stub->CancelJob(ctx.get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("needs role admin"));
  v1::SubmitJobRequest submit;
  v1::SubmitJobResponse submitted;
  ctx = CallContext(absl::Seconds(5));
  s = stub->SubmitJob(ctx.get(), submit, &submitted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
}

TEST_F(E2eAuthTest, NoTokenOrAWrongTokenIsUnauthenticatedAndHealthStaysOpen) {
  E2eCluster& c = *cluster_;
  for (const std::string& token : {std::string(), std::string("not-a-known-token")}) {
    auto stub = SchedulerStub(token);
    v1::ListJobsRequest req;
    v1::ListJobsResponse resp;
    auto ctx = CallContext(absl::Seconds(5));
    grpc::Status s = stub->ListJobs(ctx.get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token << s.error_message();
  }
  // psctl without --token_file (an empty one given, so the fixture adds none).
  CommandResult r = c.Psctl({"--token_file=", "jobs"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("pass --token_file"));
  // The data plane refuses a stream without a token before it starts.
  auto ps = ServerStub("");
  v1::PullRequest pull;
  auto ctx = CallContext(absl::Seconds(5));
  auto reader = ps->Pull(ctx.get(), pull);
  v1::PullChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  // Health checking needs no credential.
  for (const char* name : {"scheduler", "server-1", "worker-1"}) {
    auto ch = MakeChannel(c.processes().Address(name));
    ASSERT_TRUE(ch.ok());
    auto health = grpc::health::v1::Health::NewStub(*ch);
    grpc::health::v1::HealthCheckRequest hreq;
    grpc::health::v1::HealthCheckResponse hresp;
    auto hctx = CallContext(absl::Seconds(5));
    grpc::Status hs = health->Check(hctx.get(), hreq, &hresp);
    EXPECT_TRUE(hs.ok()) << name << ": " << hs.error_message();
    EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << name;
  }
}

TEST_F(E2eAuthTest, AWorkersTokenCannotDropAJobOnAServer) {
  auto ps = ServerStub(kWorker);
  v1::DropJobRequest req;
  req.set_job_id("job-1");
  v1::DropJobResponse resp;
  auto ctx = CallContext(absl::Seconds(5));
  grpc::Status s = ps->DropJob(ctx.get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("DropJob needs role scheduler; 'workers' has"));
  // Nor can a worker assign itself work: WorkerControl takes the scheduler's calls only.
  ChannelOptions co;
  co.bearer_token = kWorker;
  auto ch = MakeChannel(cluster_->processes().Address("worker-1"), co);
  ASSERT_TRUE(ch.ok());
  auto worker = v1::WorkerControl::NewStub(*ch);
  v1::StopTaskRequest stop;
  v1::StopTaskResponse stopped;
  ctx = CallContext(absl::Seconds(5));
  s = worker->StopTask(ctx.get(), stop, &stopped);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  // The scheduler's token may ask a server for its status.
  auto as_scheduler = ServerStub(kScheduler);
  v1::ServerStatusRequest sreq;
  v1::ServerStatus sresp;
  ctx = CallContext(absl::Seconds(5));
  s = as_scheduler->Status(ctx.get(), sreq, &sresp);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// --quota_file with the real daemons: the scheduler learns what alice's running job holds from
// its servers' Status, and refuses her next submission naming the quota.
TEST_F(E2eAuthTest, AServerMemoryQuotaRefusesASubmissionOnceTheServersReportTheJobsTables) {
  E2eCluster& c = *cluster_;
  const std::string job = c.WriteFile("held.yaml", FashionJobYaml("held", 200, "", 32));
  CommandResult submit = c.Psctl({"submit", job});
  ASSERT_EQ(submit.exit_code, 0) << submit.output << c.LogTails();
  const size_t at = submit.output.find("job-");
  ASSERT_NE(at, std::string::npos) << submit.output;
  const std::string id = submit.output.substr(at, submit.output.find_first_not_of(
                                                      "job-0123456789", at) - at);
  // Its servers hold its tables once its workers have created them (the blocks are spread over
  // both servers: one may hold only the biases).
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> servers;
  servers.push_back(ServerStub(kScheduler, "server-1"));
  servers.push_back(ServerStub(kScheduler, "server-2"));
  uint64_t held = 0;
  std::string last;  // The last answers, for the failure message.
  EXPECT_TRUE(WaitFor(absl::Seconds(60), [&] {
    held = 0;
    last.clear();
    for (auto& server : servers) {
      v1::ServerStatusRequest req;
      req.set_job_id(id);
      v1::ServerStatus st;
      auto ctx = CallContext(absl::Seconds(5));
      grpc::Status s = server->Status(ctx.get(), req, &st);
      if (!s.ok()) {
        absl::StrAppend(&last, "Status: ", s.error_code(), " ", s.error_message(), "; ");
        continue;
      }
      for (const v1::JobOnServer& j : st.jobs()) {
        for (const v1::TableStatus& t : j.tables()) held += t.bytes();
      }
    }
    absl::StrAppend(&last, id, ": ", held, " bytes on its servers");
    return held > 1024;
  })) << last << c.LogTails();
  // The scheduler polls each running job's servers every half second.
  CommandResult refused;
  EXPECT_TRUE(WaitFor(absl::Seconds(20), [&] {
    refused = c.Psctl({"submit", job});
    if (refused.exit_code == 0) {
      // Accepted before a poll saw the tables: take it back and try again.
      const size_t a = refused.output.find("job-");
      if (a != std::string::npos) {
        c.Psctl({"cancel", refused.output.substr(
                               a, refused.output.find_first_not_of("job-0123456789", a) - a)});
      }
      return false;
    }
    return true;
  })) << refused.output;
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_THAT(refused.output,
              HasSubstr("quota: identity 'alice' may hold at most 1 KiB of server memory "
                        "(--quota_file " + *dir_ + "/quotas:2); its running jobs hold "));
  EXPECT_THAT(refused.output, HasSubstr(id));
  CommandResult cancel = c.Psctl({"cancel", id});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.output;
}

TEST_F(E2eAuthTest, SighupReloadsTheTokenFile) {
  E2eCluster& c = *cluster_;
  const std::string late = "--token_file=" + *dir_ + "/late.token";
  CommandResult before = c.Psctl({late, "jobs"});
  EXPECT_EQ(before.exit_code, 1) << before.output;
  Write(*dir_ + "/tokens", TokenLines() + Sha256Hex(kLateViewer) + " latecomer viewer\n");
  ASSERT_TRUE(c.processes().Signal("scheduler", SIGHUP).ok());
  EXPECT_TRUE(WaitFor(absl::Seconds(10), [&] {
    return c.Psctl({late, "jobs"}).exit_code == 0;
  })) << c.LogTails();
  // A broken file is refused on reload and the last good one stays in force.
  Write(*dir_ + "/tokens", "broken\n");
  ASSERT_TRUE(c.processes().Signal("scheduler", SIGHUP).ok());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(c.Psctl({late, "jobs"}).exit_code, 0);
  Write(*dir_ + "/tokens", TokenLines());
}

}  // namespace
}  // namespace pscluster::testing
