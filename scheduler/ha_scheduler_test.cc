// Two schedulers in this process over a real etcd (scheduler/testing/etcd_cluster.h): the
// follower answers GetJob, ListJobs and GetShardMap from what the leader wrote to etcd, asks the
// leader for ClusterStatus, and refuses every other call with UNAVAILABLE naming the leader.
#include "scheduler/ha_scheduler.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/testing/http_get.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait_for.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/testing/etcd_cluster.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::HttpGet;
using ::pscluster::testing::IsOk;
using ::pscluster::testing::WaitFor;
using ::testing::HasSubstr;

constexpr char kJob[] = R"(name: test-job
model: {kind: mlp, hidden: [8]}
dataset: {name: fashion_mnist}
optimizer: {kind: sgd, learning_rate: 0.1}
num_servers: 2
num_workers: 2
epochs: 1
batch_size: 10
export_path: /tmp/m.safetensors
)";

class HaSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/ha");
    ASSERT_EQ(std::system(absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'").c_str()), 0);
    auto etcd = testing::EtcdCluster::Start(dir, 1);
    ASSERT_THAT(etcd, IsOk());
    etcd_ = std::move(*etcd);
  }
  std::unique_ptr<HaScheduler> StartOne() {
    SchedulerDaemonOptions d;
    d.listen_address = "127.0.0.1:0";
    d.metrics_address = "127.0.0.1:0";
    d.http_address = "127.0.0.1:0";
    HaOptions ha;
    ha.etcd_endpoints = etcd_->endpoints();
    ha.lease_seconds = 2;
    auto h = HaScheduler::Start(d, ha);
    EXPECT_THAT(h, IsOk());
    return h.ok() ? std::move(*h) : nullptr;
  }
  static std::unique_ptr<v1::Scheduler::Stub> Stub(const HaScheduler& h) {
    auto channel = MakeChannel(h.address());
    EXPECT_THAT(channel, IsOk());
    return v1::Scheduler::NewStub(*channel);
  }
  static absl::Status Get(v1::Scheduler::Stub* stub, const std::string& id, v1::Job* job) {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id(id);
    grpc::Status s = stub->GetJob(&ctx, req, job);
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }

  std::unique_ptr<testing::EtcdCluster> etcd_;
};

TEST_F(HaSchedulerTest, AFollowerServesReadsFromEtcdAndRefusesTheRestNamingTheLeader) {
  std::unique_ptr<HaScheduler> leader = StartOne();
  ASSERT_NE(leader, nullptr);
  ASSERT_TRUE(WaitFor(absl::Seconds(20), [&] { return leader->leading(); }));
  std::unique_ptr<HaScheduler> follower = StartOne();
  ASSERT_NE(follower, nullptr);
  ASSERT_TRUE(WaitFor(absl::Seconds(20), [&] { return follower->leader() == leader->address(); }));
  EXPECT_FALSE(follower->leading());
  // Both answer a scrape: the leader's daemon its metrics, the follower that it follows.
  const std::string leader_metrics = HttpGet(leader->metrics_port(), "/metrics");
  EXPECT_THAT(leader_metrics, HasSubstr("pscluster_scheduler_leading 1"));
  EXPECT_THAT(leader_metrics, HasSubstr("pscluster_scheduler_term "));
  EXPECT_THAT(leader_metrics, HasSubstr("pscluster_scheduler_jobs"));
  ASSERT_NE(follower->metrics_port(), 0);
  EXPECT_THAT(HttpGet(follower->metrics_port(), "/metrics"),
              HasSubstr("pscluster_scheduler_leading 0"));
  auto to_leader = Stub(*leader);
  auto to_follower = Stub(*follower);

  std::string id;
  {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    req.set_yaml(kJob);
    req.set_source("job.yaml");
    v1::SubmitJobResponse resp;
    grpc::Status s = to_leader->SubmitJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    id = resp.job_id();
  }

  // Reads: the job as the leader wrote it (queued: there are no nodes).
  v1::Job job;
  ASSERT_TRUE(WaitFor(absl::Seconds(5), [&] { return Get(to_follower.get(), id, &job).ok(); }));
  EXPECT_EQ(job.job_id(), id);
  EXPECT_EQ(job.state(), v1::JOB_QUEUED);
  EXPECT_EQ(job.spec().name(), "test-job");
  {
    grpc::ClientContext ctx;
    v1::ListJobsRequest req;
    v1::ListJobsResponse resp;
    ASSERT_TRUE(to_follower->ListJobs(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.jobs_size(), 1);
    EXPECT_EQ(resp.jobs(0).job_id(), id);
  }
  {
    grpc::ClientContext ctx;
    v1::GetShardMapRequest req;
    req.set_job_id(id);
    v1::ShardMap map;
    grpc::Status s = to_follower->GetShardMap(&ctx, req, &map);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("has no shard map yet"));
  }
  EXPECT_EQ(Get(to_follower.get(), "job-999", &job).code(), absl::StatusCode::kNotFound);

  // The status page too: the follower serves it, the nodes and jobs asked of the leader.
  ASSERT_NE(follower->http_port(), 0);
  ASSERT_NE(follower->http_port(), leader->http_port());
  EXPECT_THAT(HttpGet(follower->http_port(), "/"), HasSubstr("Content-Type: text/html"));
  const std::string jobs = HttpGet(follower->http_port(), "/api/jobs");
  EXPECT_THAT(jobs, HasSubstr("200 OK"));
  EXPECT_THAT(jobs, HasSubstr(absl::StrCat("\"job_id\":\"", id, "\"")));
  EXPECT_THAT(jobs, HasSubstr("\"state\":\"JOB_QUEUED\""));
  EXPECT_THAT(HttpGet(follower->http_port(), absl::StrCat("/api/jobs/", id)),
              HasSubstr("\"name\":\"test-job\""));
  EXPECT_THAT(HttpGet(follower->http_port(), "/api/jobs/job-999"), HasSubstr("404"));
  EXPECT_THAT(HttpGet(leader->http_port(), "/api/jobs"),
              HasSubstr(absl::StrCat("\"job_id\":\"", id, "\"")));

  // Everything else: UNAVAILABLE naming the leader, and nothing changes.
  const std::string names_leader = absl::StrCat("the leader is at ", leader->address());
  {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    req.set_yaml(kJob);
    v1::SubmitJobResponse resp;
    grpc::Status s = to_follower->SubmitJob(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(s.error_message(), HasSubstr(names_leader));
  }
  {
    grpc::ClientContext ctx;
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::CancelJobResponse resp;
    grpc::Status s = to_follower->CancelJob(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(s.error_message(), HasSubstr(names_leader));
  }
  {
    grpc::ClientContext ctx;
    v1::ClusterStatusRequest req;
    v1::ClusterStatusResponse resp;
    grpc::Status s = to_follower->ClusterStatus(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << "answered by the leader: " << s.error_message();
    ASSERT_EQ(resp.jobs_size(), 1);
    EXPECT_EQ(resp.jobs(0).job_id(), id);
    grpc::ClientContext lctx;
    v1::ClusterStatusResponse from_leader;
    ASSERT_TRUE(to_leader->ClusterStatus(&lctx, req, &from_leader).ok());
    EXPECT_EQ(resp.jobs_size(), from_leader.jobs_size());
    EXPECT_EQ(resp.nodes_size(), from_leader.nodes_size());
  }
  ASSERT_THAT(Get(to_leader.get(), id, &job), IsOk());
  EXPECT_EQ(job.state(), v1::JOB_QUEUED);

  // A change at the leader reaches the follower's answers within a second or so.
  {
    grpc::ClientContext ctx;
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::CancelJobResponse resp;
    ASSERT_TRUE(to_leader->CancelJob(&ctx, req, &resp).ok());
  }
  EXPECT_TRUE(WaitFor(absl::Seconds(5), [&] {
    return Get(to_follower.get(), id, &job).ok() && job.state() == v1::JOB_CANCELLED;
  })) << job.DebugString();

  follower->Shutdown();
  leader->Shutdown();
}

}  // namespace
}  // namespace pscluster::scheduler
