// In-process tier: a whole scheduler daemon on port 0, driven over gRPC by stand-in servers and
// workers that register, heartbeat and report simulated training progress on loopback.
#include "scheduler/scheduler_daemon.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/channel.h"
#include "common/testing/garbage_calls.h"
#include "common/status_convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/testing/failing_store.h"
#include "scheduler/testing/fake_nodes.h"
#include "common/testing/status_matchers.h"

namespace pscluster::scheduler {
namespace {

// GET http://127.0.0.1:port/path, the whole response (status line, headers, body).
std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

using ::pscluster::scheduler::testing::FakeNode;
using ::pscluster::scheduler::testing::FakeNodeOptions;
using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr char kJob[] = R"(name: svc-job
model: {kind: mlp, hidden: [8]}
dataset: {name: fashion_mnist}
optimizer: {kind: adam, learning_rate: 0.001}
consistency: {mode: bsp}
num_servers: 2
num_workers: 2
epochs: 1
batch_size: 16
export_path: /tmp/svc-job.safetensors
)";

class SchedulerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = std::getenv("TEST_TMPDIR");
    std::string db = absl::StrCat(tmp_, "/",
                                  ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                                  ".db");
    std::remove(db.c_str());
    SchedulerDaemonOptions o;
    o.listen_address = "127.0.0.1:0";
    o.db_path = db;
    o.db_full_sync = false;
    o.rpc_timeout = absl::Seconds(2);
    o.scheduler.lease = absl::Milliseconds(2000);
    o.scheduler.tick = absl::Milliseconds(20);
    o.scheduler.status_poll_interval = absl::Milliseconds(100);
    o.scheduler.startup_grace = absl::Milliseconds(1);
    o.metrics_address = "127.0.0.1:0";
    o.scheduler.store_retry = absl::Milliseconds(50);
    auto store = Store::Open(StoreOptions{db, false});
    ASSERT_THAT(store, IsOk());
    auto failing = std::make_unique<testing::FailingStore>(std::move(*store));
    store_ = failing.get();
    auto d = SchedulerDaemon::Start(o, nullptr, std::move(failing));
    ASSERT_THAT(d, IsOk());
    daemon_ = std::move(*d);
    auto ch = MakeChannel(daemon_->address());
    ASSERT_THAT(ch, IsOk());
    channel_ = *ch;
    stub_ = v1::Scheduler::NewStub(*ch);
    health_ = grpc::health::v1::Health::NewStub(*ch);
  }
  void TearDown() override {
    nodes_.clear();
    daemon_.reset();
  }

  FakeNode* Add(v1::NodeRole role, testing::SimulatedTraining training = {}) {
    FakeNodeOptions o;
    o.role = role;
    o.scheduler_address = daemon_->address();
    o.heartbeat_interval = absl::Milliseconds(50);
    o.capacity.set_cpu_slots(1);
    o.training = training;
    auto n = FakeNode::Start(o);
    EXPECT_THAT(n, IsOk());
    EXPECT_TRUE((*n)->WaitRegistered(absl::Seconds(5)));
    nodes_.push_back(std::move(*n));
    return nodes_.back().get();
  }

  absl::StatusOr<std::string> Submit(const std::string& yaml) {
    v1::SubmitJobRequest req;
    req.set_yaml(yaml);
    req.set_source("svc.yaml");
    v1::SubmitJobResponse resp;
    auto ctx = CallContext(absl::Seconds(5));
    absl::Status s = FromGrpcStatus(stub_->SubmitJob(ctx.get(), req, &resp));
    if (!s.ok()) return s;
    return resp.job_id();
  }
  absl::StatusOr<v1::Job> Get(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    auto ctx = CallContext(absl::Seconds(5));
    absl::Status s = FromGrpcStatus(stub_->GetJob(ctx.get(), req, &job));
    if (!s.ok()) return s;
    return job;
  }
  // Waits (bounded) until the job is in a final state.
  v1::Job WaitFinished(const std::string& id, absl::Duration timeout = absl::Seconds(20)) {
    absl::Time end = absl::Now() + timeout;
    v1::Job job;
    while (absl::Now() < end) {
      auto j = Get(id);
      EXPECT_THAT(j, IsOk());
      if (!j.ok()) break;
      job = *j;
      if (job.state() == v1::JOB_SUCCEEDED || job.state() == v1::JOB_FAILED ||
          job.state() == v1::JOB_CANCELLED) {
        return job;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "job " << id << " did not finish in " << timeout << ": "
                  << job.DebugString();
    return job;
  }

  std::string tmp_;
  std::unique_ptr<SchedulerDaemon> daemon_;
  testing::FailingStore* store_ = nullptr;  // The daemon's store; fails writes on demand.
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  std::vector<std::unique_ptr<FakeNode>> nodes_;
};

TEST_F(SchedulerServiceTest, ServesHealth) {
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  auto ctx = CallContext(absl::Seconds(5));
  ASSERT_TRUE(health_->Check(ctx.get(), req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// A write that fails makes the daemon NOT_SERVING and its changing calls UNAVAILABLE until
// the store works again.
TEST_F(SchedulerServiceTest, AFailedStoreWriteShowsInHealthUntilTheStoreWorks) {
  auto health = [&] {
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    auto ctx = CallContext(absl::Seconds(5));
    EXPECT_TRUE(health_->Check(ctx.get(), req, &resp).ok());
    return resp.status();
  };
  ASSERT_EQ(health(), grpc::health::v1::HealthCheckResponse::SERVING);
  Add(v1::ROLE_SERVER);
  Add(v1::ROLE_SERVER);
  Add(v1::ROLE_WORKER);
  Add(v1::ROLE_WORKER);
  store_->FailWrites(true);
  EXPECT_THAT(Submit(kJob), StatusIs(absl::StatusCode::kUnavailable,
                                     HasSubstr("cannot write its state")));
  EXPECT_EQ(health(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_THAT(Submit(kJob), StatusIs(absl::StatusCode::kUnavailable));
  store_->FailWrites(false);
  for (int i = 0; i < 200 && health() != grpc::health::v1::HealthCheckResponse::SERVING; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(health(), grpc::health::v1::HealthCheckResponse::SERVING);
  v1::ListJobsRequest list;
  v1::ListJobsResponse jobs;
  auto ctx = CallContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->ListJobs(ctx.get(), list, &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0) << "the refused submissions left nothing";
}

TEST_F(SchedulerServiceTest, AJobRunsToSuccessOverGrpc) {
  FakeNode* s1 = Add(v1::ROLE_SERVER);
  FakeNode* s2 = Add(v1::ROLE_SERVER);
  testing::SimulatedTraining t;
  t.total_steps = 12;
  t.report_every = 3;
  t.test_accuracy = 0.885;
  Add(v1::ROLE_WORKER, t);
  Add(v1::ROLE_WORKER, t);
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  v1::Job job = WaitFinished(*id);
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.reason();
  EXPECT_DOUBLE_EQ(job.progress().test_accuracy(), 0.885);
  EXPECT_EQ(job.progress().step(), 12);
  EXPECT_EQ(job.export_path(), "/tmp/svc-job.safetensors");
  EXPECT_GT(job.started_unix_ms(), 0);
  EXPECT_GE(job.finished_unix_ms(), job.started_unix_ms());
  // Both servers got the map, then (shortly after success) a DropJob.
  absl::Time end = absl::Now() + absl::Seconds(5);
  while (absl::Now() < end && (s1->server()->dropped().empty() || s2->server()->dropped().empty())) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_THAT(s1->server()->updates(), SizeIs(1));
  EXPECT_THAT(s1->server()->dropped(), ElementsAre(*id));
  EXPECT_THAT(s2->server()->dropped(), ElementsAre(*id));

  v1::ClusterStatusRequest sreq;
  v1::ClusterStatusResponse status;
  auto ctx = CallContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->ClusterStatus(ctx.get(), sreq, &status).ok());
  EXPECT_THAT(status.nodes(), SizeIs(4));
  ASSERT_THAT(status.jobs(), SizeIs(1));
  EXPECT_EQ(status.jobs(0).state(), v1::JOB_SUCCEEDED);
  EXPECT_GT(status.now_unix_ms(), 0);
}

TEST_F(SchedulerServiceTest, ServesPrometheusMetrics) {
  Add(v1::ROLE_SERVER);
  Add(v1::ROLE_WORKER);
  ASSERT_GT(daemon_->metrics_port(), 0);
  std::string page = HttpGet(daemon_->metrics_port(), "/metrics");
  EXPECT_THAT(page, HasSubstr("HTTP/1.0 200 OK"));
  EXPECT_THAT(page, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(page, HasSubstr("pscluster_scheduler_nodes{role=\"server\",state=\"alive\"} 1"));
  EXPECT_THAT(page, HasSubstr("pscluster_scheduler_nodes{role=\"worker\",state=\"alive\"} 1"));
  EXPECT_THAT(page, HasSubstr("pscluster_scheduler_jobs{state=\"queued\"} 0"));
  EXPECT_THAT(page, HasSubstr("pscluster_scheduler_registrations_total 2"));
  EXPECT_THAT(page, HasSubstr("# TYPE pscluster_scheduler_heartbeats_total counter"));
  // Every unary RPC's latency, by method: the two registrations went over gRPC.
  EXPECT_THAT(page, HasSubstr("# TYPE pscluster_scheduler_rpc_seconds histogram"));
  EXPECT_THAT(page, HasSubstr("pscluster_scheduler_rpc_seconds_count{method=\"RegisterNode\"} 2"));
  EXPECT_THAT(page, HasSubstr("pscluster_scheduler_rpc_seconds_count{method=\"SubmitJob\"} 0"));
  EXPECT_THAT(HttpGet(daemon_->metrics_port(), "/other"), HasSubstr("404 Not Found"));
}

TEST_F(SchedulerServiceTest, ErrorsTravelWithTheirExactCodes) {
  Add(v1::ROLE_SERVER);
  Add(v1::ROLE_WORKER);
  EXPECT_THAT(Submit(absl::StrReplaceAll(kJob, {{"batch_size: 16", "batch_size: -16"}})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("svc.yaml:9: batch_size: must be >= 0")));
  EXPECT_THAT(Submit(kJob), StatusIs(absl::StatusCode::kResourceExhausted,
                                     HasSubstr("num_servers: the job asks for 2 servers")));
  EXPECT_THAT(Get("job-12"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-12")));
  v1::HeartbeatRequest hb;
  hb.set_node_id("worker-99");
  v1::HeartbeatResponse resp;
  auto ctx = CallContext(absl::Seconds(5));
  EXPECT_THAT(FromGrpcStatus(stub_->Heartbeat(ctx.get(), hb, &resp)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("register again")));
}

TEST_F(SchedulerServiceTest, BytesThatDoNotParseAreInvalidArgumentNamingTheMethod) {
  ::pscluster::testing::ExpectEveryMethodRefusesGarbage(channel_, "pscluster.v1.Scheduler");
}

// Enum values the .proto does not declare are refused at submission, naming the field, and
// nothing is queued.
TEST_F(SchedulerServiceTest, UndeclaredEnumValuesAreRefusedAtSubmission) {
  Add(v1::ROLE_SERVER);
  Add(v1::ROLE_WORKER);
  struct Case {
    std::function<void(v1::JobSpec*)> damage;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](v1::JobSpec* j) {
         j->mutable_consistency()->set_mode(static_cast<v1::ConsistencySpec::Mode>(7));
       },
       "job.consistency.mode: 7"},
      {[](v1::JobSpec* j) {
         j->mutable_optimizer()->set_kind(static_cast<v1::OptimizerSpec::Kind>(42));
       },
       "job.optimizer.kind: 42"},
      {[](v1::JobSpec* j) {
         j->mutable_optimizer()->set_lr_schedule(static_cast<v1::OptimizerSpec::Schedule>(9));
       },
       "job.optimizer.lr_schedule: 9"},
  };
  for (const Case& c : cases) {
    v1::SubmitJobRequest req;
    v1::JobSpec* job = req.mutable_job();
    job->set_name("enums");
    job->mutable_model()->set_kind("softmax");
    job->mutable_dataset()->set_name("fashion_mnist");
    job->set_num_servers(1);
    job->set_num_workers(1);
    job->set_epochs(1);
    job->set_batch_size(16);
    job->mutable_optimizer()->set_learning_rate(0.1f);
    c.damage(job);
    v1::SubmitJobResponse resp;
    auto ctx = CallContext(absl::Seconds(5));
    EXPECT_THAT(FromGrpcStatus(stub_->SubmitJob(ctx.get(), req, &resp)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)));
  }
  v1::ListJobsRequest list;
  v1::ListJobsResponse jobs;
  auto ctx = CallContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->ListJobs(ctx.get(), list, &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0) << jobs.DebugString();
}

TEST_F(SchedulerServiceTest, AKilledWorkersRankMovesToASpareWorkerAndTheJobFinishes) {
  Add(v1::ROLE_SERVER);
  Add(v1::ROLE_SERVER);
  testing::SimulatedTraining slow;
  slow.total_steps = 800;  // 4 s: longer than the 2 s lease.
  slow.step_time = absl::Milliseconds(5);
  slow.report_every = 10;
  std::vector<FakeNode*> workers;
  for (int i = 0; i < 3; ++i) workers.push_back(Add(v1::ROLE_WORKER, slow));
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end && Get(*id)->progress().step() < 10) absl::SleepFor(absl::Milliseconds(10));
  v1::Job job = *Get(*id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING);
  FakeNode* victim = nullptr;
  for (FakeNode* w : workers) {
    if (w->node_id() == job.workers(1)) victim = w;
  }
  ASSERT_NE(victim, nullptr);
  const std::string victim_id = victim->node_id();
  victim->Crash();
  job = WaitFinished(*id);
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.recovery().recoveries(), 1u);
  EXPECT_THAT(job.recovery().last_cause(),
              HasSubstr(absl::StrCat("worker of rank 1 ", victim_id, " at ", victim->address(),
                                     " stopped heartbeating")));
  // No checkpoints: the job started again from step 0 on the live workers.
  EXPECT_EQ(job.progress().rolled_back_to_step(), 0);
  EXPECT_THAT(job.workers(), ::testing::Not(::testing::Contains(victim_id)));
  EXPECT_EQ(job.progress().step(), 800);
  std::string page = HttpGet(daemon_->metrics_port(), "/metrics");
  EXPECT_THAT(page, HasSubstr("pscluster_scheduler_job_recoveries_total 1"));
}

TEST_F(SchedulerServiceTest, AReportedErrorFailsTheJob) {
  Add(v1::ROLE_SERVER);
  Add(v1::ROLE_SERVER);
  testing::SimulatedTraining ok;
  ok.total_steps = 100000;
  testing::SimulatedTraining broken;
  broken.fail_at_step = 3;
  broken.report_every = 1;
  broken.error = "data set /nope: not found (install dataset-fashion-mnist)";
  Add(v1::ROLE_WORKER, ok);
  FakeNode* bad = Add(v1::ROLE_WORKER, broken);
  auto id = Submit(absl::StrReplaceAll(kJob, {{"num_workers: 2", "num_workers: 2\nseed: 1"}}));
  ASSERT_THAT(id, IsOk());
  v1::Job job = WaitFinished(*id);
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  // Which worker failed depends on placement; this job's worker that failed is named.
  EXPECT_THAT(job.reason(), HasSubstr("dataset-fashion-mnist"));
  EXPECT_THAT(job.reason(), HasSubstr(bad->node_id()));
}

}  // namespace
}  // namespace pscluster::scheduler
