// Hostile calls to a real scheduler daemon (port 0, SQLite file): thousands of requests to every
// Scheduler RPC with every field filled at random (edge integers, NaN, unknown enum values, odd
// strings, deep nesting), mixed with the ids of real jobs and nodes and with damaged job files.
// The daemon must answer each call with a status of its own within its deadline (never a
// dropped connection, an INTERNAL error or a message the client refused for its size), keep
// serving, and restart from its database afterwards with the same jobs in the same states: no
// hostile request may poison the persisted state. (Requests whose strings are not UTF-8 are
// refused at the edge before they reach the handler: INVALID_ARGUMENT naming the method.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/job.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/scheduler_daemon.h"
#include "common/testing/message_fuzzer.h"
#include "scheduler/testing/fake_nodes.h"

namespace pscluster::scheduler {
namespace {


// A job file: the valid one, damaged in a few places.
std::string DamagedJobYaml(::pscluster::testing::MessageFuzzer& fuzz) {
  std::string text = ::pscluster::testing::kFuzzJobYaml;
  const std::string syntax = ":-[]{}&*!|>'\"%@,? \n0123456789";
  for (int i = 0, n = fuzz.Pick(4); i < n; ++i) {
    const size_t at = static_cast<size_t>(fuzz.Pick(static_cast<int>(text.size())));
    switch (fuzz.Pick(3)) {
      case 0: text[at] = syntax[fuzz.Pick(static_cast<int>(syntax.size()))]; break;
      case 1: text.insert(at, 1, syntax[fuzz.Pick(static_cast<int>(syntax.size()))]); break;
      default: text.erase(at, 1 + fuzz.Pick(10)); break;
    }
    if (text.empty()) text = "x";
  }
  return text;
}

class SchedulerFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/fuzz.db");
    std::remove(db_.c_str());
    StartDaemon();
  }
  void TearDown() override {
    nodes_.clear();
    daemon_.reset();
  }

  void StartDaemon() {
    SchedulerDaemonOptions o;
    o.listen_address = "127.0.0.1:0";
    o.db_path = db_;
    o.db_full_sync = false;
    o.rpc_timeout = absl::Milliseconds(500);
    o.scheduler.lease = absl::Milliseconds(2000);
    o.scheduler.tick = absl::Milliseconds(20);
    o.scheduler.status_poll_interval = absl::Milliseconds(100);
    o.scheduler.startup_grace = absl::Milliseconds(1);
    auto d = SchedulerDaemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    auto ch = MakeChannel(daemon_->address());
    ASSERT_TRUE(ch.ok()) << ch.status();
    channel_ = *ch;
    stub_ = v1::Scheduler::NewStub(channel_);
  }

  // Every job (finished ones too) with its state, newest first.
  std::vector<std::string> JobIds() {
    v1::ListJobsRequest req;
    req.set_include_finished(true);
    v1::ListJobsResponse resp;
    auto ctx = CallContext(absl::Seconds(5));
    grpc::Status st = stub_->ListJobs(ctx.get(), req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    std::vector<std::string> ids;
    for (const auto& j : resp.jobs()) {
      ids.push_back(absl::StrCat(j.job_id(), " ", v1::JobState_Name(j.state())));
    }
    return ids;
  }

  std::string db_;
  std::unique_ptr<SchedulerDaemon> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  std::vector<std::unique_ptr<testing::FakeNode>> nodes_;
};

TEST_F(SchedulerFuzzTest, RandomRequestsToEveryRpcGetAStatusAndThePersistedStateSurvives) {
  // A real server and worker (stand-ins that heartbeat and report progress), so that jobs get
  // placed and the fuzzer has real ids to aim at.
  for (v1::NodeRole role : {v1::ROLE_SERVER, v1::ROLE_WORKER}) {
    testing::FakeNodeOptions o;
    o.role = role;
    o.scheduler_address = daemon_->address();
    o.heartbeat_interval = absl::Milliseconds(50);
    o.capacity.set_cpu_slots(1);
    auto n = testing::FakeNode::Start(o);
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_TRUE((*n)->WaitRegistered(absl::Seconds(5)));
    nodes_.push_back(std::move(*n));
  }
  ::pscluster::testing::MessageFuzzer fuzz(11);
  fuzz.SetStrings({"", "x", "127.0.0.1:1", "127.0.0.1:0", "[::1]:1", "no-port", ":",
                   "host:99999", "../../etc/passwd", "fuzz-job", "name: x\nepochs: [",
                   "job-\xff\xfe", "n\x01\x02"});
  const ::pscluster::testing::CallTally tally = ::pscluster::testing::RunFuzzCalls(
      ::pscluster::testing::FuzzIterations(2000), absl::Seconds(5),
      [&](int i, grpc::ClientContext* ctx, std::string* rpc) {
    grpc::Status st;
    switch (fuzz.Pick(11)) {
      case 0: {
        *rpc = "RegisterNode";
        v1::RegisterNodeRequest req;
        fuzz.Fill(&req);
        v1::RegisterNodeResponse resp;
        st = stub_->RegisterNode(ctx, req, &resp);
        if (st.ok()) fuzz.AddKnown(resp.node_id());
        break;
      }
      case 1: {
        *rpc = "Heartbeat";
        v1::HeartbeatRequest req;
        fuzz.Fill(&req);
        v1::HeartbeatResponse resp;
        st = stub_->Heartbeat(ctx, req, &resp);
        break;
      }
      case 2: {
        *rpc = "Deregister";
        v1::DeregisterRequest req;
        fuzz.Fill(&req);
        v1::DeregisterResponse resp;
        st = stub_->Deregister(ctx, req, &resp);
        break;
      }
      case 3:
      case 4: {
        *rpc = "SubmitJob";
        v1::SubmitJobRequest req;
        fuzz.Fill(&req);
        if (fuzz.Pick(2) == 0) {
          req.clear_spec();
          req.set_yaml(DamagedJobYaml(fuzz));
        }
        v1::SubmitJobResponse resp;
        st = stub_->SubmitJob(ctx, req, &resp);
        if (st.ok()) fuzz.AddKnown(resp.job_id());
        break;
      }
      case 5: {
        *rpc = "GetJob";
        v1::GetJobRequest req;
        fuzz.Fill(&req);
        v1::Job resp;
        st = stub_->GetJob(ctx, req, &resp);
        break;
      }
      case 6: {
        *rpc = "CancelJob";
        v1::CancelJobRequest req;
        fuzz.Fill(&req);
        v1::CancelJobResponse resp;
        st = stub_->CancelJob(ctx, req, &resp);
        break;
      }
      case 9: {
        *rpc = "MoveShard";
        v1::MoveShardRequest req;
        fuzz.Fill(&req);
        if (fuzz.Pick(2) == 0) req.set_job_id(absl::StrCat("job-", 1 + fuzz.Pick(4)));
        v1::MoveShardResponse resp;
        st = stub_->MoveShard(ctx, req, &resp);
        break;
      }
      case 7: {
        *rpc = "GetShardMap";
        v1::GetShardMapRequest req;
        fuzz.Fill(&req);
        v1::ShardMap resp;
        st = stub_->GetShardMap(ctx, req, &resp);
        break;
      }
      case 8: {
        *rpc = "ReportProgress";
        v1::ReportProgressRequest req;
        fuzz.Fill(&req);
        v1::ReportProgressResponse resp;
        st = stub_->ReportProgress(ctx, req, &resp);
        break;
      }
      default: {
        *rpc = fuzz.Pick(2) == 0 ? "ClusterStatus" : "ListJobs";
        if (*rpc == "ClusterStatus") {
          v1::ClusterStatusRequest req;
          fuzz.Fill(&req);
          v1::ClusterStatusResponse resp;
          st = stub_->ClusterStatus(ctx, req, &resp);
        } else {
          v1::ListJobsRequest req;
          fuzz.Fill(&req);
          v1::ListJobsResponse resp;
          st = stub_->ListJobs(ctx, req, &resp);
        }
        break;
      }
    }
    return st;
  });
  if (HasFatalFailure() || HasNonfatalFailure()) return;

  // Still serving, and a valid job is still accepted.
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckResponse hresp;
  {
    auto ctx = CallContext(absl::Seconds(5));
    ASSERT_TRUE(health->Check(ctx.get(), hreq, &hresp).ok());
    EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  {
    v1::SubmitJobRequest req;
    req.set_yaml(::pscluster::testing::kFuzzJobYaml);
    req.set_source("after.yaml");
    v1::SubmitJobResponse resp;
    auto ctx = CallContext(absl::Seconds(5));
    grpc::Status st = stub_->SubmitJob(ctx.get(), req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
  }
  // What was persisted restores: the same jobs in the same states after a restart on the same
  // database. The stand-in nodes go first (their jobs fail as they leave), so the state is
  // settled when it is compared.
  nodes_.clear();
  std::vector<std::string> before = JobIds();
  for (int i = 0; i < 50; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    std::vector<std::string> now = JobIds();
    if (now == before) break;
    before = now;
  }
  EXPECT_GT(before.size(), 1u);
  daemon_.reset();
  StartDaemon();
  const std::vector<std::string> after = JobIds();
  EXPECT_EQ(after.size(), before.size());
  for (size_t i = 0; i < std::min(before.size(), after.size()); ++i) {
    EXPECT_EQ(after[i], before[i]) << "job " << i << " of " << before.size();
  }
  auto ctx = CallContext(absl::Seconds(5));
  v1::ClusterStatusRequest req;
  v1::ClusterStatusResponse resp;
  grpc::Status st = stub_->ClusterStatus(ctx.get(), req, &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
}

}  // namespace
}  // namespace pscluster::scheduler
