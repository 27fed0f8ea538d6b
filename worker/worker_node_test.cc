// WorkerNode through its real gRPC service, against a small in-test scheduler on loopback.
#include "worker/worker_node.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/channel.h"
#include "common/grpc_server.h"
#include "common/testing/wait_for.h"
#include "proto/scheduler.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "worker/worker_service.h"

namespace pscluster::worker {
namespace {

// A scheduler that records what workers tell it.
class RecordingScheduler final : public v1::Scheduler::Service {
 public:
  grpc::Status RegisterNode(grpc::ServerContext*, const v1::RegisterNodeRequest* req,
                            v1::RegisterNodeResponse* resp) override {
    absl::MutexLock l(&mu);
    ++registrations;
    node = req->node();
    forget = false;
    resp->set_node_id("worker-7");
    resp->set_lease_ms(3000);
    resp->set_heartbeat_interval_ms(50);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    absl::MutexLock l(&mu);
    if (forget) return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown node");
    ++heartbeats;
    last_heartbeat = *req;
    resp->set_lease_ms(3000);
    return grpc::Status::OK;
  }
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest*,
                          v1::DeregisterResponse*) override {
    absl::MutexLock l(&mu);
    ++deregistrations;
    return grpc::Status::OK;
  }
  grpc::Status ReportProgress(grpc::ServerContext*, const v1::ReportProgressRequest* req,
                              v1::ReportProgressResponse* resp) override {
    std::function<void(const v1::ReportProgressRequest&)> hook;
    {
      absl::MutexLock l(&mu);
      reports.push_back(*req);
      resp->set_cancel(cancel_job);
      hook = on_report;
    }
    if (hook) hook(*req);  // Before the worker hears the answer.
    return grpc::Status::OK;
  }
  grpc::Status GetShardMap(grpc::ServerContext*, const v1::GetShardMapRequest* req,
                           v1::ShardMap* map) override {
    map->set_job_id(req->job_id());
    map->set_epoch(9);
    return grpc::Status::OK;
  }

  absl::Mutex mu;
  int registrations ABSL_GUARDED_BY(mu) = 0;
  int heartbeats ABSL_GUARDED_BY(mu) = 0;
  int deregistrations ABSL_GUARDED_BY(mu) = 0;
  bool forget ABSL_GUARDED_BY(mu) = false;
  bool cancel_job ABSL_GUARDED_BY(mu) = false;
  v1::NodeInfo node ABSL_GUARDED_BY(mu);
  v1::HeartbeatRequest last_heartbeat ABSL_GUARDED_BY(mu);
  std::vector<v1::ReportProgressRequest> reports ABSL_GUARDED_BY(mu);
  std::function<void(const v1::ReportProgressRequest&)> on_report ABSL_GUARDED_BY(mu);
};

// Runs `steps` steps of 10 ms each, reporting every step; can be told to fail (at step 3).
class StepRunner final : public TaskRunner {
 public:
  StepRunner(int steps, ProgressSink* sink, absl::Status fail)
      : steps_(steps), sink_(sink), fail_(std::move(fail)) {}
  absl::Status Run() override {
    for (int s = 1; s <= steps_; ++s) {
      if (cancelled_.load()) return absl::CancelledError("cancelled");
      absl::SleepFor(absl::Milliseconds(10));
      step_.store(s);
      if (!fail_.ok() && s == 3) return fail_;
      v1::WorkerProgress p;
      p.set_step(s);
      p.set_total_steps(steps_);
      p.set_test_accuracy(0.5);
      if (!sink_->Report(p)) return absl::CancelledError("scheduler said stop");
    }
    return absl::OkStatus();
  }
  void Cancel(absl::string_view) override { cancelled_.store(true); }
  void UpdateShardMap(const v1::ShardMap& map) override { epoch_.store(map.epoch()); }
  // Refuses more than three extra parts, as a real task refuses a partition that does not fit.
  absl::Status UpdatePartition(const v1::UpdatePartitionRequest& u) override {
    if (u.partition().also_size() > 3) return absl::InvalidArgumentError("partition.also: too many");
    return absl::OkStatus();
  }
  // Writes nothing: answers the path with the task's step, off the RPC thread.
  absl::StatusOr<ExportFn> PrepareExport(const std::string& path) override {
    if (path == "/refused") return absl::FailedPreconditionError("not yet");
    int64_t step = step_.load();
    return ExportFn([path, step]() -> absl::StatusOr<v1::ExportModelResponse> {
      v1::ExportModelResponse r;
      r.set_path(path);
      r.set_step(step);
      return r;
    });
  }
  TaskSnapshot Snapshot() const override {
    TaskSnapshot s;
    s.step = step_.load();
    s.shard_map_epoch = epoch_.load();
    s.samples_per_sec = 123;
    return s;
  }

 private:
  const int steps_;
  ProgressSink* const sink_;
  const absl::Status fail_;
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> step_{0};
  std::atomic<uint64_t> epoch_{1};
};

class WorkerNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sched = GrpcServer::Start({}, {&scheduler_});
    ASSERT_TRUE(sched.ok());
    sched_server_ = std::move(*sched);
    auto client = SchedulerClient::Create(sched_server_->address(), {}, absl::Seconds(5));
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
  }

  void StartNode(int steps, absl::Status fail = absl::OkStatus()) {
    WorkerNodeOptions opts;
    opts.address = "127.0.0.1:1";
    opts.capacity.set_cpu_slots(1);
    opts.device = "cpu (test)";
    opts.report_interval = absl::ZeroDuration();
    node_ = std::make_unique<WorkerNode>(
        opts, client_.get(),
        [steps, fail](const v1::AssignTaskRequest&,
                      ProgressSink* sink) -> absl::StatusOr<std::unique_ptr<TaskRunner>> {
          return std::make_unique<StepRunner>(steps, sink, fail);
        });
    service_ = std::make_unique<WorkerService>(node_.get());
    auto server = GrpcServer::Start({}, {service_.get()});
    ASSERT_TRUE(server.ok());
    worker_server_ = std::move(*server);
    node_->Start([this](absl::Status s) { fatal_ = s; });
    stub_ = v1::WorkerControl::NewStub(*MakeChannel(worker_server_->address()));
  }

  v1::AssignTaskRequest Task(const std::string& job, uint32_t rank = 0) {
    v1::AssignTaskRequest t;
    t.set_job_id(job);
    t.set_rank(rank);
    t.set_num_workers(2);
    t.mutable_spec()->set_name("test");
    t.mutable_shard_map()->set_job_id(job);
    t.mutable_shard_map()->add_assignments()->set_primary("server-1");
    return t;
  }

  grpc::Status Assign(const v1::AssignTaskRequest& t) {
    v1::AssignTaskResponse resp;
    auto ctx = CallContext(absl::Seconds(5));
    return stub_->AssignTask(ctx.get(), t, &resp);
  }

  bool WaitFor(std::function<bool()> pred, absl::Duration timeout = absl::Seconds(10)) {
    return ::pscluster::testing::WaitFor(timeout, pred, absl::Milliseconds(10));
  }

  void TearDown() override {
    if (worker_server_) worker_server_->Shutdown();
    if (node_) node_->Shutdown();
  }

  RecordingScheduler scheduler_;
  std::unique_ptr<GrpcServer> sched_server_;
  std::unique_ptr<SchedulerClient> client_;
  std::unique_ptr<WorkerNode> node_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<GrpcServer> worker_server_;
  std::unique_ptr<v1::WorkerControl::Stub> stub_;
  absl::Status fatal_;
};

TEST_F(WorkerNodeTest, RegistersAndHeartbeats) {
  StartNode(5);
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock l(&scheduler_.mu);
    return scheduler_.heartbeats >= 3;
  }));
  absl::MutexLock l(&scheduler_.mu);
  EXPECT_EQ(scheduler_.node.role(), v1::ROLE_WORKER);
  EXPECT_EQ(scheduler_.node.address(), "127.0.0.1:1");
  EXPECT_EQ(scheduler_.node.capacity().cpu_slots(), 1u);
  EXPECT_EQ(scheduler_.last_heartbeat.node_id(), "worker-7");
  EXPECT_EQ(node_->node_id(), "worker-7");
}

TEST_F(WorkerNodeTest, RunsATaskAndReportsDone) {
  StartNode(5);
  ASSERT_TRUE(Assign(Task("job-1")).ok());
  ASSERT_TRUE(node_->WaitIdle(absl::Seconds(10)));
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock l(&scheduler_.mu);
    return !scheduler_.reports.empty() && scheduler_.reports.back().progress().done();
  }));
  absl::MutexLock l(&scheduler_.mu);
  const auto& last = scheduler_.reports.back();
  EXPECT_EQ(last.job_id(), "job-1");
  EXPECT_EQ(last.progress().step(), 5);
  EXPECT_EQ(last.progress().node_id(), "worker-7");
  EXPECT_TRUE(last.progress().error().empty());
}

TEST_F(WorkerNodeTest, OneTaskAtATime) {
  StartNode(1000);
  ASSERT_TRUE(Assign(Task("job-1")).ok());
  EXPECT_TRUE(Assign(Task("job-1")).ok());  // The same assignment again is idempotent.
  grpc::Status busy = Assign(Task("job-2"));
  EXPECT_EQ(busy.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(busy.error_message().find("busy with job job-1"), std::string::npos);

  v1::WorkerStatus st;
  auto ctx = CallContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->Status(ctx.get(), {}, &st).ok());
  EXPECT_TRUE(st.busy());
  EXPECT_EQ(st.job_id(), "job-1");
  EXPECT_EQ(st.device(), "cpu (test)");
  EXPECT_EQ(st.attempt(), 0u);
}

// WorkerControl.UpdatePartition reaches only the task it names (job, rank and attempt).
TEST_F(WorkerNodeTest, APartitionUpdateReachesOnlyTheTaskItNames) {
  StartNode(100000);
  auto update = [&](const std::string& job, uint32_t attempt, int parts) {
    v1::UpdatePartitionRequest req;
    req.set_job_id(job);
    req.set_rank(0);
    req.set_attempt(attempt);
    req.mutable_partition()->set_count(4);
    for (int i = 1; i <= parts; ++i) req.mutable_partition()->add_also(i);
    v1::UpdatePartitionResponse resp;
    auto ctx = CallContext(absl::Seconds(5));
    return stub_->UpdatePartition(ctx.get(), req, &resp);
  };
  grpc::Status idle = update("job-1", 0, 1);
  EXPECT_EQ(idle.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(idle.error_message().find("(idle)"), std::string::npos) << idle.error_message();
  ASSERT_TRUE(Assign(Task("job-1")).ok());
  EXPECT_TRUE(update("job-1", 0, 1).ok());
  grpc::Status other = update("job-1", 3, 1);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(other.error_message().find("running: job job-1 rank 0 attempt 0"), std::string::npos)
      << other.error_message();
  EXPECT_EQ(update("job-2", 0, 1).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(update("job-1", 0, 4).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// WorkerControl.ExportModel reaches only the task it names; the task's own refusal comes back.
TEST_F(WorkerNodeTest, AnExportReachesOnlyTheTaskItNames) {
  StartNode(100000);
  auto export_model = [&](const std::string& job, uint32_t attempt, const std::string& path,
                          v1::ExportModelResponse* resp) {
    v1::ExportModelRequest req;
    req.set_job_id(job);
    req.set_rank(0);
    req.set_attempt(attempt);
    req.set_path(path);
    auto ctx = CallContext(absl::Seconds(5));
    return stub_->ExportModel(ctx.get(), req, resp);
  };
  v1::ExportModelResponse resp;
  grpc::Status idle = export_model("job-1", 0, "/m.safetensors", &resp);
  EXPECT_EQ(idle.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(idle.error_message().find("(idle)"), std::string::npos) << idle.error_message();
  ASSERT_TRUE(Assign(Task("job-1")).ok());
  ASSERT_TRUE(export_model("job-1", 0, "/m.safetensors", &resp).ok());
  EXPECT_EQ(resp.path(), "/m.safetensors");
  EXPECT_EQ(export_model("job-1", 2, "/m.safetensors", &resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(export_model("job-1", 0, "/refused", &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(WorkerNodeTest, ATaskOfAnotherAttemptOfTheSameJobIsNotTheSameTask) {
  StartNode(100000);
  v1::AssignTaskRequest first = Task("job-1");
  ASSERT_TRUE(Assign(first).ok());
  // After a recovery the scheduler assigns the job again (attempt 1): while the old task still
  // runs, that is a different task, not a repeat of the running one.
  v1::AssignTaskRequest again = Task("job-1");
  again.set_attempt(1);
  again.set_start_step(300);
  grpc::Status busy = Assign(again);
  EXPECT_EQ(busy.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(busy.error_message().find("attempt 0"), std::string::npos) << busy.error_message();
  // The running task's reports carry its attempt, so the scheduler can tell them apart.
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock l(&scheduler_.mu);
    return !scheduler_.reports.empty();
  }));
  {
    absl::MutexLock l(&scheduler_.mu);
    EXPECT_EQ(scheduler_.reports.back().progress().attempt(), 0u);
  }
  v1::StopTaskRequest stop;
  stop.set_job_id("job-1");
  v1::StopTaskResponse sresp;
  auto ctx = CallContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->StopTask(ctx.get(), stop, &sresp).ok());
  ASSERT_TRUE(node_->WaitIdle(absl::Seconds(10)));
  ASSERT_TRUE(Assign(again).ok());
  v1::WorkerStatus st;
  auto ctx2 = CallContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->Status(ctx2.get(), {}, &st).ok());
  EXPECT_EQ(st.attempt(), 1u);
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock l(&scheduler_.mu);
    return !scheduler_.reports.empty() && scheduler_.reports.back().progress().attempt() == 1u;
  }));
}

TEST_F(WorkerNodeTest, StopTaskCancelsWithoutReportingDone) {
  StartNode(100000);
  ASSERT_TRUE(Assign(Task("job-1")).ok());
  v1::StopTaskRequest stop;
  stop.set_job_id("job-other");
  v1::StopTaskResponse resp;
  auto ctx = CallContext(absl::Seconds(5));
  EXPECT_EQ(stub_->StopTask(ctx.get(), stop, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  stop.set_job_id("job-1");
  auto ctx2 = CallContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->StopTask(ctx2.get(), stop, &resp).ok());
  ASSERT_TRUE(node_->WaitIdle(absl::Seconds(10)));
  {
    absl::MutexLock l(&scheduler_.mu);
    for (const auto& r : scheduler_.reports) EXPECT_FALSE(r.progress().done());
  }
  // The worker takes the next task.
  EXPECT_TRUE(Assign(Task("job-2")).ok());
}

TEST_F(WorkerNodeTest, SchedulerCancellationStopsTheTask) {
  {
    absl::MutexLock l(&scheduler_.mu);
    scheduler_.cancel_job = true;
  }
  StartNode(100000);
  ASSERT_TRUE(Assign(Task("job-1")).ok());
  EXPECT_TRUE(node_->WaitIdle(absl::Seconds(10)));
}

TEST_F(WorkerNodeTest, FailureIsReportedWithTheWorkerNamed) {
  StartNode(10, absl::InternalError("exploded at step 3"));
  ASSERT_TRUE(Assign(Task("job-1", 1)).ok());
  ASSERT_TRUE(node_->WaitIdle(absl::Seconds(10)));
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock l(&scheduler_.mu);
    return !scheduler_.reports.empty() && !scheduler_.reports.back().progress().error().empty();
  }));
  absl::MutexLock l(&scheduler_.mu);
  const std::string& err = scheduler_.reports.back().progress().error();
  EXPECT_NE(err.find("exploded at step 3"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 1"), std::string::npos) << err;
  EXPECT_FALSE(scheduler_.reports.back().progress().done());
  EXPECT_FALSE(scheduler_.reports.back().progress().retryable());
}

// The scheduler acts on a failure report at once: it may hand the rank back to this worker
// (a new attempt) before the report's call has returned to the worker. The new task is taken,
// not refused as "busy" with the ended one.
TEST_F(WorkerNodeTest, TheEndedTasksRankCanComeBackBeforeItsReportReturns) {
  v1::AssignTaskRequest again = Task("job-1", 1);
  again.set_attempt(1);
  std::thread assign;
  absl::Notification assigned;
  grpc::Status answer;
  absl::Cleanup done = [&] {
    {
      absl::MutexLock l(&scheduler_.mu);
      scheduler_.on_report = nullptr;
    }
    if (assign.joinable()) assign.join();
  };
  {
    absl::MutexLock l(&scheduler_.mu);
    scheduler_.on_report = [&](const v1::ReportProgressRequest& r) {
      if (r.progress().error().empty() || assign.joinable()) return;
      assign = std::thread([&] {
        answer = Assign(again);
        assigned.Notify();
      });
      // Without waiting for the ended task, the worker would answer at once (refused).
      assigned.WaitForNotificationWithTimeout(absl::Milliseconds(500));
    };
  }
  StartNode(10, absl::InternalError("exploded at step 3"));
  ASSERT_TRUE(Assign(Task("job-1", 1)).ok());
  ASSERT_TRUE(WaitFor([&] { return assigned.HasBeenNotified(); }));
  EXPECT_TRUE(answer.ok()) << answer.error_message();
  v1::WorkerStatus st;
  auto ctx = CallContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->Status(ctx.get(), {}, &st).ok());
  EXPECT_EQ(st.attempt(), 1u);
}

// A server out of reach within the call deadline is a failure another worker may not meet: the
// report says so, and the scheduler hands the rank over instead of failing the job.
class RetryableFailureTest : public WorkerNodeTest,
                             public ::testing::WithParamInterface<absl::StatusCode> {};

TEST_P(RetryableFailureTest, AnUnreachableServerIsReportedAsRetryable) {
  StartNode(10, absl::Status(GetParam(), "PushPull to 10.0.0.7:7101: no answer"));
  ASSERT_TRUE(Assign(Task("job-1", 1)).ok());
  ASSERT_TRUE(node_->WaitIdle(absl::Seconds(10)));
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock l(&scheduler_.mu);
    return !scheduler_.reports.empty() && !scheduler_.reports.back().progress().error().empty();
  }));
  absl::MutexLock l(&scheduler_.mu);
  const v1::WorkerProgress& p = scheduler_.reports.back().progress();
  EXPECT_NE(p.error().find("10.0.0.7:7101"), std::string::npos) << p.error();
  EXPECT_TRUE(p.retryable());
}

INSTANTIATE_TEST_SUITE_P(Codes, RetryableFailureTest,
                         ::testing::Values(absl::StatusCode::kUnavailable,
                                           absl::StatusCode::kDeadlineExceeded));

TEST_F(WorkerNodeTest, BadAssignmentsNameTheField) {
  StartNode(5);
  auto t = Task("job-1", 2);
  grpc::Status s = Assign(t);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("rank"), std::string::npos);
  t = Task("");
  EXPECT_EQ(Assign(t).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  t = Task("job-1");
  t.mutable_shard_map()->clear_assignments();
  s = Assign(t);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("shard_map"), std::string::npos);
}

TEST_F(WorkerNodeTest, ReRegistersWhenTheSchedulerForgetsIt) {
  StartNode(5);
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock l(&scheduler_.mu);
    return scheduler_.heartbeats >= 1;
  }));
  {
    absl::MutexLock l(&scheduler_.mu);
    scheduler_.forget = true;
  }
  EXPECT_TRUE(WaitFor([&] {
    absl::MutexLock l(&scheduler_.mu);
    return scheduler_.registrations >= 2;
  }));
}

TEST(WorkerNodeFatalTest, GivesUpWhenTheSchedulerIsUnreachable) {
  // A port nobody listens on: bind, note, close.
  std::string address;
  {
    auto s = GrpcServer::Start({}, {});
    ASSERT_TRUE(s.ok());
    address = (*s)->address();
  }
  auto client = SchedulerClient::Create(address, {}, absl::Milliseconds(200));
  ASSERT_TRUE(client.ok());
  WorkerNodeOptions opts;
  opts.address = "127.0.0.1:1";
  opts.registration_timeout = absl::Seconds(1);
  WorkerNode node(opts, client->get(), nullptr);
  absl::Notification fatal;
  absl::Status why;
  node.Start([&](absl::Status s) {
    why = s;
    fatal.Notify();
  });
  ASSERT_TRUE(fatal.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable) << why;
  EXPECT_NE(why.message().find(address), std::string::npos) << why;
  node.Shutdown();
}

}  // namespace
}  // namespace pscluster::worker
