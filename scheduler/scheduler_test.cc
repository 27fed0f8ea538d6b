// The Scheduler handler driven directly with a FakeClock and RunOnce(), calling real gRPC
// stand-ins for servers and workers on loopback.
#include "scheduler/scheduler.h"

#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/grpc_cluster_rpc.h"
#include "scheduler/testing/failing_store.h"
#include "scheduler/testing/fake_nodes.h"
#include "common/testing/status_matchers.h"
#include "common/checkpoint_file.h"
#include "common/atomic_file.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::scheduler::testing::FakeNode;
using ::pscluster::scheduler::testing::FakeParameterServer;
using ::pscluster::scheduler::testing::FakeNodeOptions;
using ::pscluster::scheduler::testing::FakeWorker;
using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr char kJob[] = R"(name: test-job
model: {kind: mlp, hidden: [8]}
dataset: {name: fashion_mnist}
optimizer: {kind: sgd, learning_rate: 0.1}
consistency: {mode: bsp}
num_servers: 2
num_workers: 2
epochs: 1
batch_size: 10
export_path: /tmp/m.safetensors
)";

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = std::string(std::getenv("TEST_TMPDIR")) + "/" +
          ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".db";
    std::remove(db_.c_str());
    GrpcClusterRpcOptions ro;
    ro.timeout = absl::Seconds(5);
    rpc_ = std::make_unique<GrpcClusterRpc>(ro);
    options_.lease = absl::Seconds(10);
    options_.startup_grace = absl::Seconds(1);
    StartScheduler();
  }
  void TearDown() override {
    sched_.reset();
    store_.reset();
  }

  void StartScheduler() {
    sched_.reset();
    store_.reset();
    auto store = Store::Open(StoreOptions{db_, false});
    ASSERT_THAT(store, IsOk());
    store_ = std::move(*store);
    if (failing_store_) {
      auto f = std::make_unique<testing::FailingStore>(std::move(store_));
      failing_ = f.get();
      store_ = std::move(f);
    }
    auto s = Scheduler::Create(options_, store_.get(), &clock_, rpc_.get(), &placement_);
    ASSERT_THAT(s, IsOk());
    sched_ = std::move(*s);
  }

  // Starts a stand-in node and registers it with the handler; returns its id.
  std::string AddNode(v1::NodeRole role, uint32_t gpus = 0) {
    FakeNodeOptions o;
    o.role = role;
    o.capacity.set_gpus(gpus);
    o.capacity.set_cpu_slots(1);
    o.capacity.set_memory_bytes(uint64_t{1} << 30);
    o.training.run = false;
    auto n = FakeNode::Start(o);
    EXPECT_THAT(n, IsOk());
    v1::RegisterNodeRequest req;
    req.mutable_node()->set_role(role);
    req.mutable_node()->set_address((*n)->address());
    *req.mutable_node()->mutable_capacity() = o.capacity;
    req.mutable_node()->set_pid(1000 + nodes_.size());
    v1::RegisterNodeResponse resp;
    EXPECT_THAT(sched_->RegisterNode(req, &resp), IsOk());
    (*n)->worker() ? (*n)->worker()->set_node_id(resp.node_id()) : void();
    ids_.push_back(resp.node_id());
    nodes_.push_back(std::move(*n));
    return resp.node_id();
  }
  FakeNode* Node(const std::string& id) {
    for (size_t i = 0; i < ids_.size(); ++i) {
      if (ids_[i] == id) return nodes_[i].get();
    }
    return nullptr;
  }
  void AddCluster(int servers, int workers) {
    for (int i = 0; i < servers; ++i) AddNode(v1::ROLE_SERVER);
    for (int i = 0; i < workers; ++i) AddNode(v1::ROLE_WORKER);
  }
  // `node` leaves the cluster (Deregister), as a machine taken away would.
  void Leave(const std::string& node) {
    v1::DeregisterRequest dr;
    dr.set_node_id(node);
    ASSERT_THAT(sched_->Deregister(dr), IsOk());
  }
  // The stand-in workers do not train here: tell them their task ended.
  void FinishTasks(const std::string& job_id) {
    v1::Job job = Get(job_id);
    for (const std::string& w : job.workers()) Node(w)->worker()->FinishTask();
  }
  // Advances the clock by `by` while every node but `silent` heartbeats, then runs the loop.
  void AdvanceWithout(const std::string& silent, absl::Duration by) {
    clock_.Advance(by);
    for (const std::string& n : ids_) {
      if (n == silent) continue;
      v1::HeartbeatRequest hb;
      hb.set_node_id(n);
      v1::HeartbeatResponse r;
      ASSERT_THAT(sched_->Heartbeat(hb, &r), IsOk());
    }
    sched_->RunOnce();
  }
  void BeatAll() {
    for (const std::string& id : ids_) {
      v1::HeartbeatRequest hb;
      hb.set_node_id(id);
      v1::HeartbeatResponse resp;
      (void)sched_->Heartbeat(hb, &resp);
    }
  }

  // Submits `yaml` and runs the control loop once: the job must be running (fatal otherwise).
  void StartJob(const std::string& yaml, std::string* id) {
    auto submitted = Submit(yaml);
    ASSERT_THAT(submitted, IsOk());
    *id = *submitted;
    sched_->RunOnce();
    v1::Job job = Get(*id);
    ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  }

  absl::StatusOr<std::string> Submit(const std::string& yaml, const std::string& token = "") {
    v1::SubmitJobRequest req;
    req.set_yaml(yaml);
    req.set_source("job.yaml");
    req.set_client_token(token);
    v1::SubmitJobResponse resp;
    absl::Status s = sched_->SubmitJob(req, &resp);
    if (!s.ok()) return s;
    return resp.job_id();
  }
  // The job's current shard map, as GetShardMap returns it.
  v1::ShardMap MapOf(const std::string& id) {
    v1::GetShardMapRequest req;
    req.set_job_id(id);
    v1::ShardMap map;
    EXPECT_THAT(sched_->GetShardMap(req, &map), IsOk());
    return map;
  }
  v1::Job Get(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    EXPECT_THAT(sched_->GetJob(req, &job), IsOk());
    return job;
  }
  absl::StatusOr<bool> Report(const std::string& job, uint32_t rank, int64_t step, bool done,
                              const std::string& error = "", const std::string& export_path = "",
                              uint32_t attempt = 0) {
    v1::ReportProgressRequest req;
    req.set_job_id(job);
    v1::WorkerProgress* p = req.mutable_progress();
    p->set_rank(rank);
    p->set_attempt(attempt);
    p->set_step(step);
    p->set_total_steps(10);
    p->set_loss(0.5);
    p->set_samples_per_sec(100);
    p->set_test_accuracy(done ? 0.91 : -1);
    p->set_done(done);
    p->set_error(error);
    p->set_export_path(export_path);
    v1::ReportProgressResponse resp;
    absl::Status s = sched_->ReportProgress(req, &resp);
    if (!s.ok()) return s;
    return resp.cancel();
  }

  FakeClock clock_;
  std::string db_;
  SchedulerOptions options_;
  std::unique_ptr<GrpcClusterRpc> rpc_;
  CapacityPlacement placement_;
  std::unique_ptr<Store> store_;
  bool failing_store_ = false;              // StartScheduler wraps the store in a FailingStore.
  testing::FailingStore* failing_ = nullptr;  // That store, when it does.
  std::unique_ptr<Scheduler> sched_;
  std::vector<std::unique_ptr<FakeNode>> nodes_;
  std::vector<std::string> ids_;
};

// psctl checkpoint: every server of a running job writes a checkpoint into the directory asked
// for (or the job's own); refused, naming why, for an unknown job, one not running, and one
// without a directory.
TEST_F(SchedulerTest, ACheckpointOnDemandAsksEveryServerOfTheJob) {
  AddCluster(2, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &id));
  v1::CheckpointJobRequest req;
  req.set_job_id(id);
  v1::CheckpointJobResponse resp;
  // kJob has no checkpoint_dir: a directory must be named.
  EXPECT_THAT(sched_->CheckpointJob(req, &resp),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no checkpoint_dir")));
  req.set_dir("/shared/ckpt");
  ASSERT_THAT(sched_->CheckpointJob(req, &resp), IsOk());
  const v1::Job job = Get(id);
  ASSERT_EQ(resp.files_size(), job.servers_size());
  for (int i = 0; i < job.servers_size(); ++i) {
    const std::string& s = job.servers(i);
    EXPECT_EQ(resp.files(i).server(), s);
    EXPECT_EQ(resp.files(i).path(), "/shared/ckpt/" + id + "/fake-step0.ckpt");
    const auto asked = Node(s)->server()->checkpoints();
    ASSERT_EQ(asked.size(), 1u);
    EXPECT_EQ(asked[0].job_id(), id);
    EXPECT_EQ(asked[0].dir(), "/shared/ckpt");
  }
  v1::CheckpointJobRequest unknown;
  unknown.set_job_id("job-404");
  EXPECT_THAT(sched_->CheckpointJob(unknown, &resp),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-404")));
  // A finished job's servers no longer hold it.
  FinishTasks(id);
  for (uint32_t r = 0; r < 2; ++r) ASSERT_THAT(Report(id, r, 10, true), IsOk());
  sched_->RunOnce();
  ASSERT_EQ(Get(id).state(), v1::JOB_SUCCEEDED);
  EXPECT_THAT(sched_->CheckpointJob(req, &resp),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("JOB_SUCCEEDED")));
}

// Persist before publish: a write that fails keeps what it would have published from every
// node, makes the scheduler refuse changes (UNAVAILABLE, naming the store) and report itself
// not serving, until the store works again; then it carries on from what the store holds.
TEST_F(SchedulerTest, AFailedWriteIsStickyAndNothingUnwrittenIsPublished) {
  failing_store_ = true;
  StartScheduler();
  std::vector<bool> serving;
  sched_->OnServingChanged([&](bool s) { serving.push_back(s); });
  AddCluster(2, 2);
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  failing_->FailWrites(true);
  sched_->RunOnce();  // The placement's map cannot be written: it goes nowhere.
  sched_->RunOnce();
  for (const std::string& n : ids_) {
    FakeNode* node = Node(n);
    if (node->server() != nullptr) {
      EXPECT_THAT(node->server()->updates(), IsEmpty()) << n;
    }
    if (node->worker() != nullptr) {
      EXPECT_THAT(node->worker()->assigned(), IsEmpty()) << n;
    }
  }
  EXPECT_THAT(sched_->store_status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(db_)));
  EXPECT_THAT(serving, ElementsAre(false));
  EXPECT_THAT(Submit(kJob), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("store")));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(*id);
  v1::CancelJobResponse cancelled;
  EXPECT_THAT(sched_->CancelJob(cancel, &cancelled), StatusIs(absl::StatusCode::kUnavailable));
  v1::MoveShardRequest move;
  move.set_job_id(*id);
  move.set_to(ids_[0]);
  v1::MoveShardResponse moved;
  EXPECT_THAT(sched_->MoveShard(move, &moved), StatusIs(absl::StatusCode::kUnavailable));
  v1::RegisterNodeRequest reg;
  reg.mutable_node()->set_role(v1::ROLE_WORKER);
  reg.mutable_node()->set_address("127.0.0.1:1");
  reg.mutable_node()->mutable_capacity()->set_cpu_slots(1);
  v1::RegisterNodeResponse registered;
  EXPECT_THAT(sched_->RegisterNode(reg, &registered), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(sched_->RenderMetrics(), HasSubstr("pscluster_scheduler_store_ok 0"));

  // The store works again: the job, as the store holds it (queued), is placed at epoch 1,
  // written before it is sent.
  failing_->FailWrites(false);
  clock_.Advance(options_.store_retry);
  BeatAll();
  sched_->RunOnce();
  EXPECT_THAT(sched_->store_status(), IsOk());
  EXPECT_THAT(serving, ElementsAre(false, true));
  v1::Job job = Get(*id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.shard_map_epoch(), 1u);
  for (const std::string& s : job.servers()) {
    auto updates = Node(s)->server()->updates();
    ASSERT_THAT(updates, SizeIs(1)) << s;
    EXPECT_EQ(updates[0].map().epoch(), 1u);
  }
  EXPECT_THAT(sched_->RenderMetrics(), HasSubstr("pscluster_scheduler_store_ok 1"));
  // What the servers hold is what the store holds.
  failing_store_ = false;
  StartScheduler();
  EXPECT_EQ(MapOf(*id).epoch(), 1u);
}

TEST_F(SchedulerTest, PlacesAJobOnServersAndWorkers) {
  AddCluster(2, 2);
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  EXPECT_EQ(*id, "job-1");
  EXPECT_EQ(Get(*id).state(), v1::JOB_QUEUED);
  sched_->RunOnce();
  v1::Job job = Get(*id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.shard_map_epoch(), 1u);
  EXPECT_THAT(job.servers(), SizeIs(2));
  EXPECT_THAT(job.workers(), SizeIs(2));

  for (const std::string& s : job.servers()) {
    auto updates = Node(s)->server()->updates();
    ASSERT_THAT(updates, SizeIs(1)) << s;
    EXPECT_EQ(updates[0].self(), s);
    EXPECT_EQ(updates[0].map().job_id(), *id);
    EXPECT_EQ(updates[0].map().epoch(), 1u);
    EXPECT_EQ(updates[0].map().num_virtual_shards(), 64u);
    EXPECT_THAT(updates[0].map().assignments(), SizeIs(64));
  }
  for (int rank = 0; rank < 2; ++rank) {
    auto tasks = Node(job.workers(rank))->worker()->assigned();
    ASSERT_THAT(tasks, SizeIs(1));
    EXPECT_EQ(tasks[0].job_id(), *id);
    EXPECT_EQ(tasks[0].rank(), static_cast<uint32_t>(rank));
    EXPECT_EQ(tasks[0].num_workers(), 2u);
    EXPECT_EQ(tasks[0].partition().index(), static_cast<uint32_t>(rank));
    EXPECT_EQ(tasks[0].partition().count(), 2u);
    EXPECT_EQ(tasks[0].spec().name(), "test-job");
    EXPECT_EQ(tasks[0].shard_map().epoch(), 1u);
  }
  v1::ShardMap map = MapOf(*id);
  EXPECT_EQ(map.epoch(), 1u);
  EXPECT_THAT(map.servers(), SizeIs(2));

  v1::ClusterStatusRequest sreq;
  v1::ClusterStatusResponse status;
  ASSERT_THAT(sched_->ClusterStatus(sreq, &status), IsOk());
  ASSERT_THAT(status.nodes(), SizeIs(4));
  for (const auto& n : status.nodes()) {
    EXPECT_EQ(n.state(), v1::NODE_ALIVE);
    EXPECT_THAT(n.jobs(), ElementsAre(*id)) << n.info().node_id();
  }
}

TEST_F(SchedulerTest, ProgressThenSuccessThenDropJob) {
  AddCluster(2, 2);
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  EXPECT_THAT(Report(*id, 0, 4, false), IsOk());
  EXPECT_THAT(Report(*id, 1, 3, false), IsOk());
  v1::Job job = Get(*id);
  EXPECT_EQ(job.progress().step(), 3);
  EXPECT_THAT(job.progress().waiting_for(), ElementsAre(1));  // BSP: rank 1 is behind.
  EXPECT_DOUBLE_EQ(job.progress().samples_per_sec(), 200);

  auto cancel = Report(*id, 1, 10, true);
  ASSERT_THAT(cancel, IsOk());
  EXPECT_FALSE(*cancel);
  EXPECT_EQ(Get(*id).state(), v1::JOB_RUNNING);  // Rank 0 is not done yet.
  ASSERT_THAT(Report(*id, 0, 10, true, "", "/tmp/m.safetensors"), IsOk());
  job = Get(*id);
  EXPECT_EQ(job.state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(job.export_path(), "/tmp/m.safetensors");
  EXPECT_DOUBLE_EQ(job.progress().test_accuracy(), 0.91);
  EXPECT_GT(job.finished_unix_ms(), 0);
  sched_->RunOnce();
  for (const std::string& s : job.servers()) {
    EXPECT_THAT(Node(s)->server()->dropped(), ElementsAre(*id)) << s;
  }
  for (const std::string& w : job.workers()) {
    EXPECT_THAT(Node(w)->worker()->stopped(), IsEmpty());  // They finished by themselves.
  }
}

TEST_F(SchedulerTest, AWorkerErrorFailsTheJobNamingTheWorker) {
  AddCluster(2, 2);
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*id);
  auto cancel = Report(*id, 1, 2, false, "out of memory");
  ASSERT_THAT(cancel, IsOk());
  EXPECT_TRUE(*cancel);
  job = Get(*id);
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("rank 1"));
  EXPECT_THAT(job.reason(), HasSubstr(job.workers(1)));
  EXPECT_THAT(job.reason(), HasSubstr(Node(job.workers(1))->address()));
  EXPECT_THAT(job.reason(), HasSubstr("out of memory"));
  // Rank 0 is told to stop, through its next report and through StopTask.
  EXPECT_THAT(Report(*id, 0, 3, false), IsOk());
  EXPECT_TRUE(*Report(*id, 0, 3, false));
  sched_->RunOnce();
  EXPECT_THAT(Node(job.workers(0))->worker()->stopped(), SizeIs(1));
  for (const std::string& s : job.servers()) {
    EXPECT_THAT(Node(s)->server()->dropped(), ElementsAre(*id));
  }
}

// A task that failed because it could not reach a server (WorkerProgress.retryable: a partition
// between that worker and the server) hands its rank to another idle worker, fenced, with no
// rollback; past the recovery limit such a failure fails the job like any other.
TEST_F(SchedulerTest, ARankWhoseWorkerCouldNotReachAServerGoesToAnotherWorker) {
  AddCluster(2, 3);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &id));
  v1::Job job = Get(id);
  const std::string cut_off = job.workers(1);
  for (const std::string& s : job.servers()) Node(s)->server()->SetClocks({12, 11});
  auto report = [&](uint32_t rank, uint32_t attempt, bool retryable) {
    v1::ReportProgressRequest req;
    req.set_job_id(id);
    req.mutable_progress()->set_rank(rank);
    req.mutable_progress()->set_attempt(attempt);
    req.mutable_progress()->set_step(11);
    req.mutable_progress()->set_error("UNAVAILABLE: PushPull to 10.0.0.7:7101: deadline exceeded");
    req.mutable_progress()->set_retryable(retryable);
    v1::ReportProgressResponse resp;
    EXPECT_THAT(sched_->ReportProgress(req, &resp), IsOk());
    return resp.cancel();
  };
  EXPECT_TRUE(report(1, 0, true));
  EXPECT_EQ(Get(id).state(), v1::JOB_RUNNING);
  sched_->RunOnce();
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().handovers(), 1u);
  EXPECT_EQ(job.recovery().recoveries(), 0u);
  EXPECT_THAT(job.recovery().last_cause(), HasSubstr(absl::StrCat("worker of rank 1 (", cut_off)));
  EXPECT_THAT(job.recovery().last_cause(), HasSubstr("PushPull to 10.0.0.7:7101"));
  // Not back to the worker that could not reach the server, although it is idle and alive.
  const std::string spare = job.workers(1);
  EXPECT_NE(spare, cut_off);
  auto assigned = Node(spare)->worker()->assigned();
  ASSERT_THAT(assigned, SizeIs(1));
  EXPECT_EQ(assigned[0].rank(), 1u);
  EXPECT_EQ(assigned[0].start_step(), 11);
  EXPECT_EQ(assigned[0].attempt(), 1u);
  for (const std::string& s : job.servers()) {
    EXPECT_THAT(Node(s)->server()->fences(), SizeIs(1));
    EXPECT_THAT(Node(s)->server()->dropped(), IsEmpty());
  }
  // A report of the old attempt changes nothing any more.
  EXPECT_TRUE(report(1, 0, true));
  sched_->RunOnce();
  EXPECT_EQ(Get(id).recovery().handovers(), 1u);

}

TEST_F(SchedulerTest, WithRecoveryOffAWorkerThatCouldNotReachAServerFailsTheJob) {
  options_.max_recoveries = 0;
  StartScheduler();
  AddCluster(2, 3);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &id));
  v1::Job job = Get(id);
  v1::ReportProgressRequest req;
  req.set_job_id(id);
  req.mutable_progress()->set_error("UNAVAILABLE: PushPull to 10.0.0.7:7101: deadline exceeded");
  req.mutable_progress()->set_retryable(true);
  v1::ReportProgressResponse resp;
  ASSERT_THAT(sched_->ReportProgress(req, &resp), IsOk());
  EXPECT_TRUE(resp.cancel());
  job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("worker of rank 0 (", job.workers(0))));
  EXPECT_THAT(job.reason(), HasSubstr("PushPull to 10.0.0.7:7101"));
}

TEST_F(SchedulerTest, CancelStopsTasksAndKeepsFinalStates) {
  AddCluster(2, 2);
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  v1::CancelJobRequest req;
  req.set_job_id(*id);
  req.set_reason("wrong learning rate");
  v1::CancelJobResponse resp;
  ASSERT_THAT(sched_->CancelJob(req, &resp), IsOk());
  EXPECT_EQ(resp.state(), v1::JOB_CANCELLED);
  v1::Job job = Get(*id);
  EXPECT_EQ(job.reason(), "cancelled: wrong learning rate");
  EXPECT_TRUE(*Report(*id, 0, 1, false));
  sched_->RunOnce();
  for (const std::string& w : job.workers()) {
    auto stopped = Node(w)->worker()->stopped();
    ASSERT_THAT(stopped, SizeIs(1));
    EXPECT_EQ(stopped[0].job_id(), *id);
  }
  // Cancelling again reports the final state; unknown jobs are NOT_FOUND.
  ASSERT_THAT(sched_->CancelJob(req, &resp), IsOk());
  EXPECT_EQ(resp.state(), v1::JOB_CANCELLED);
  req.set_job_id("job-404");
  EXPECT_THAT(sched_->CancelJob(req, &resp),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-404")));
}

TEST_F(SchedulerTest, AnEndedJobIsDroppedOnItsServersOnceItsWorkersHaveStopped) {
  AddCluster(2, 2);
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING);
  for (const std::string& w : job.workers()) Node(w)->worker()->HoldOnStop(true);
  v1::CancelJobRequest req;
  req.set_job_id(*id);
  v1::CancelJobResponse resp;
  ASSERT_THAT(sched_->CancelJob(req, &resp), IsOk());
  sched_->RunOnce();
  // The workers were told to stop, but still run the task: the servers keep the job.
  for (const std::string& w : job.workers()) {
    EXPECT_THAT(Node(w)->worker()->stopped(), SizeIs(1));
    EXPECT_TRUE(Node(w)->worker()->busy());
  }
  clock_.Advance(absl::Milliseconds(500));
  sched_->RunOnce();
  for (const std::string& s : job.servers()) EXPECT_THAT(Node(s)->server()->dropped(), IsEmpty());
  // Once they have stopped, the job is dropped.
  FinishTasks(*id);
  clock_.Advance(absl::Milliseconds(200));
  sched_->RunOnce();
  for (const std::string& s : job.servers()) {
    EXPECT_THAT(Node(s)->server()->dropped(), ElementsAre(*id)) << s;
  }

  // A worker that does not stop holds the servers back for task_stop_grace at most.
  auto second = Submit(kJob);
  ASSERT_THAT(second, IsOk());
  sched_->RunOnce();
  job = Get(*second);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  ASSERT_THAT(sched_->CancelJob([&] {
    v1::CancelJobRequest r;
    r.set_job_id(*second);
    return r;
  }(), &resp), IsOk());
  sched_->RunOnce();
  for (const std::string& s : job.servers()) {
    EXPECT_THAT(Node(s)->server()->dropped(), ElementsAre(*id)) << s;
  }
  clock_.Advance(options_.task_stop_grace);
  BeatAll();
  sched_->RunOnce();
  for (const std::string& s : job.servers()) {
    EXPECT_THAT(Node(s)->server()->dropped(), ElementsAre(*id, *second)) << s;
  }
}

TEST_F(SchedulerTest, QueuesWhileResourcesAreShortThenRuns) {
  AddCluster(2, 2);
  auto first = Submit(kJob);
  auto second = Submit(kJob);
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(second, IsOk());
  sched_->RunOnce();
  EXPECT_EQ(Get(*first).state(), v1::JOB_RUNNING);
  v1::Job queued = Get(*second);
  EXPECT_EQ(queued.state(), v1::JOB_QUEUED);
  EXPECT_THAT(queued.reason(), HasSubstr("waiting for resources: needs 2 idle workers, 0 "
                                         "available"));
  ASSERT_THAT(Report(*first, 0, 10, true), IsOk());
  ASSERT_THAT(Report(*first, 1, 10, true), IsOk());
  FinishTasks(*first);
  sched_->RunOnce();
  EXPECT_EQ(Get(*second).state(), v1::JOB_RUNNING);

  v1::ListJobsRequest lreq;
  lreq.set_include_finished(true);
  v1::ListJobsResponse list;
  ASSERT_THAT(sched_->ListJobs(lreq, &list), IsOk());
  ASSERT_THAT(list.jobs(), SizeIs(2));
  EXPECT_EQ(list.jobs(0).job_id(), *second);  // Newest first.
  lreq.set_include_finished(false);
  list.Clear();
  ASSERT_THAT(sched_->ListJobs(lreq, &list), IsOk());
  ASSERT_THAT(list.jobs(), SizeIs(1));
}

TEST_F(SchedulerTest, MoreWorkersThanTheClusterHasIsRefusedClearly) {
  AddCluster(2, 2);
  std::string big = absl::StrReplaceAll(kJob, {{"num_workers: 2", "num_workers: 3"}});
  // Right after a start nodes may still be re-registering: the job waits in the queue.
  auto early = Submit(big);
  ASSERT_THAT(early, IsOk());
  clock_.Advance(absl::Seconds(2));
  BeatAll();
  EXPECT_THAT(Submit(big),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("job.yaml: num_workers: the job asks for 3 workers but "
                                       "the cluster has 2 live"),
                             HasSubstr(ids_[2]), HasSubstr(ids_[3]))));
  std::string gpu = absl::StrReplaceAll(kJob, {{"num_workers: 2", "gpus_per_worker: 1\nnum_workers: 1"}});
  EXPECT_THAT(Submit(gpu), StatusIs(absl::StatusCode::kResourceExhausted,
                                    HasSubstr("workers with >= 1 GPUs")));
  std::string servers = absl::StrReplaceAll(kJob, {{"num_servers: 2", "num_servers: 5"}});
  EXPECT_THAT(Submit(servers), StatusIs(absl::StatusCode::kResourceExhausted,
                                        HasSubstr("num_servers: the job asks for 5 servers")));
  v1::ListJobsResponse list;
  ASSERT_THAT(sched_->ListJobs(v1::ListJobsRequest(), &list), IsOk());
  EXPECT_THAT(list.jobs(), SizeIs(1));  // Nothing was queued by the refused submissions.
}

TEST_F(SchedulerTest, MalformedSpecsChangeNothing) {
  AddCluster(1, 1);
  std::string bad = absl::StrReplaceAll(kJob, {{"epochs: 1", "epochs: -3"}});
  EXPECT_THAT(Submit(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("job.yaml:8: epochs: must be >= 0")));
  v1::SubmitJobRequest empty;
  v1::SubmitJobResponse resp;
  EXPECT_THAT(sched_->SubmitJob(empty, &resp),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec")));
  v1::SubmitJobRequest direct;
  direct.mutable_job()->set_name("x");
  direct.set_source("api");
  EXPECT_THAT(sched_->SubmitJob(direct, &resp),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("api: model.kind")));
  v1::ListJobsResponse list;
  ASSERT_THAT(sched_->ListJobs(v1::ListJobsRequest(), &list), IsOk());
  EXPECT_THAT(list.jobs(), IsEmpty());
}

TEST_F(SchedulerTest, BadCallsGetExactCodes) {
  AddCluster(2, 2);
  v1::GetJobRequest g;
  v1::Job job;
  EXPECT_THAT(sched_->GetJob(g, &job), StatusIs(absl::StatusCode::kInvalidArgument));
  g.set_job_id("job-9");
  EXPECT_THAT(sched_->GetJob(g, &job), StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-9")));
  auto id = Submit(absl::StrReplaceAll(kJob, {{"num_workers: 2", "num_workers: 1"}}));
  ASSERT_THAT(id, IsOk());
  v1::GetShardMapRequest m;
  m.set_job_id(*id);
  v1::ShardMap map;
  EXPECT_THAT(sched_->GetShardMap(m, &map),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("queued")));
  sched_->RunOnce();
  EXPECT_THAT(Report(*id, 1, 1, false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("progress.rank")));
  EXPECT_THAT(Report(*id, 0, -1, false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("progress.step")));
  EXPECT_THAT(Report("job-77", 0, 1, false), StatusIs(absl::StatusCode::kNotFound));
  // A report from a node that does not run the rank is told to stop.
  v1::ReportProgressRequest req;
  req.set_job_id(*id);
  req.mutable_progress()->set_node_id("worker-99");
  v1::ReportProgressResponse resp;
  ASSERT_THAT(sched_->ReportProgress(req, &resp), IsOk());
  EXPECT_TRUE(resp.cancel());
}

TEST_F(SchedulerTest, ALapsedLeaseFailsTheRunningJobNamingTheNodeWhenRecoveryIsOff) {
  options_.max_recoveries = 0;
  StartScheduler();
  AddCluster(2, 3);
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*id);
  const std::string lost = job.workers(1);
  AdvanceWithout(lost, absl::Seconds(6));
  EXPECT_EQ(sched_->registry().Get(lost)->state(), v1::NODE_SUSPECT);
  EXPECT_EQ(Get(*id).state(), v1::JOB_RUNNING);
  clock_.Advance(absl::Seconds(5));
  sched_->RunOnce();
  EXPECT_EQ(sched_->registry().Get(lost)->state(), v1::NODE_DEAD);
  job = Get(*id);
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("worker of rank 1 ", lost, " at ",
                                                   Node(lost)->address(),
                                                   " stopped heartbeating")));
  EXPECT_THAT(Node(job.workers(0))->worker()->stopped(), SizeIs(1));
}

// A job with periodic checkpoints in `dir`: every 10 steps.
std::string CheckpointedJob(const std::string& dir, int servers = 2) {
  return absl::StrReplaceAll(kJob, {{"num_servers: 2", absl::StrCat("num_servers: ", servers,
                                                                    "\ncheckpoint_every_steps: 10"
                                                                    "\ncheckpoint_dir: ",
                                                                    dir)}});
}

// Writes what server `server` checkpoints of `job` at `step`: the shards it holds in `map`.
std::string WriteCheckpoint(const std::string& dir, const v1::ShardMap& map,
                            const std::string& server, int64_t step) {
  v1::CheckpointHeader h;
  h.set_job_id(map.job_id());
  h.set_step(step);
  h.set_epoch(map.epoch());
  h.set_num_virtual_shards(map.num_virtual_shards());
  for (const auto& a : map.assignments()) {
    if (a.primary() == server) h.add_shards(a.shard());
  }
  h.set_data_bytes(0);
  std::string f;
  AppendCheckpointHead(h, &f);
  AppendCheckpointTrailer(&f);
  EXPECT_THAT(MakeDirs(dir + "/" + map.job_id()), IsOk());
  std::string path = absl::StrCat(dir, "/", map.job_id(), "/", server, "-step", step, ".ckpt");
  EXPECT_THAT(WriteFileAtomically(path, f), IsOk());
  return path;
}

TEST_F(SchedulerTest, ALostWorkersRankIsHandedToAnIdleWorkerWithNoRollback) {
  AddCluster(2, 3);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &id));
  v1::Job job = Get(id);
  const std::string lost = job.workers(1);
  const std::string kept = job.workers(0);
  // Rank 1 completed step 40 on one server and was half-way through step 41 on the other.
  Node(job.servers(0))->server()->SetClocks({42, 41});
  Node(job.servers(1))->server()->SetClocks({41, 40});
  Leave(lost);
  EXPECT_EQ(Get(id).state(), v1::JOB_RUNNING);
  sched_->RunOnce();

  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().handovers(), 1u);
  EXPECT_EQ(job.recovery().recoveries(), 0u);
  EXPECT_EQ(job.progress().rolled_back_to_step(), -1);
  EXPECT_THAT(job.recovery().last_cause(), HasSubstr(absl::StrCat("worker of rank 1 ", lost)));
  const std::string spare = job.workers(1);
  EXPECT_NE(spare, lost);
  EXPECT_NE(spare, kept);
  EXPECT_EQ(job.workers(0), kept);
  // The spare resumes rank 1 at its slowest clock, on the same shard map; nothing else moved.
  auto assigned = Node(spare)->worker()->assigned();
  ASSERT_THAT(assigned, SizeIs(1));
  EXPECT_EQ(assigned[0].rank(), 1u);
  EXPECT_EQ(assigned[0].start_step(), 40);
  EXPECT_EQ(assigned[0].attempt(), 1u);  // Above the lost task's: the servers fence that off.
  EXPECT_THAT(job.recovery().rank_attempts(), ElementsAre(0u, 1u));
  EXPECT_EQ(assigned[0].partition().index(), 1u);
  EXPECT_EQ(assigned[0].partition().count(), 2u);
  EXPECT_EQ(assigned[0].shard_map().epoch(), job.shard_map_epoch());
  EXPECT_THAT(Node(kept)->worker()->stopped(), IsEmpty());
  EXPECT_THAT(Node(kept)->worker()->assigned(), SizeIs(1));
  for (const std::string& s : job.servers()) {
    EXPECT_THAT(Node(s)->server()->dropped(), IsEmpty());
    EXPECT_THAT(Node(s)->server()->updates(), SizeIs(1));
    // Every server fenced rank 1 at the new attempt before the spare got the task: the lost
    // task, should it still run, cannot push any more.
    auto fences = Node(s)->server()->fences();
    ASSERT_THAT(fences, SizeIs(1)) << s;
    EXPECT_EQ(fences[0].job_id(), id);
    EXPECT_EQ(fences[0].worker(), 1u);
    EXPECT_EQ(fences[0].attempt(), 1u);
  }
  // The lost node's reports are refused; the spare's count.
  v1::ReportProgressRequest req;
  req.set_job_id(id);
  req.mutable_progress()->set_rank(1);
  req.mutable_progress()->set_node_id(lost);
  req.mutable_progress()->set_error("stale");
  v1::ReportProgressResponse resp;
  ASSERT_THAT(sched_->ReportProgress(req, &resp), IsOk());
  EXPECT_TRUE(resp.cancel());
  req.mutable_progress()->set_node_id(spare);
  req.mutable_progress()->clear_error();
  req.mutable_progress()->set_step(45);
  req.mutable_progress()->set_attempt(0);  // The lost task's attempt, even from the spare.
  v1::ReportProgressResponse stale;
  ASSERT_THAT(sched_->ReportProgress(req, &stale), IsOk());
  EXPECT_TRUE(stale.cancel());
  req.mutable_progress()->set_attempt(1);
  v1::ReportProgressResponse resp2;
  ASSERT_THAT(sched_->ReportProgress(req, &resp2), IsOk());
  EXPECT_FALSE(resp2.cancel());
  EXPECT_EQ(Get(id).progress().workers(1).step(), 45);
  EXPECT_EQ(Get(id).state(), v1::JOB_RUNNING);
}

// No idle worker to take a lost rank: the rank leaves the job (design section 4: the barrier
// follows the live membership), another rank reads its data, and the job trains on with no
// rollback; rank 0 leaving makes the next rank the one that evaluates and exports.
TEST_F(SchedulerTest, ALostRankWithNoIdleWorkerLeavesTheJobAndAnotherReadsItsData) {
  AddCluster(2, 3);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrReplaceAll(kJob, {{"num_workers: 2", "num_workers: 3"}}), &id));
  v1::Job job = Get(id);
  const std::vector<std::string> workers(job.workers().begin(), job.workers().end());
  Node(job.servers(0))->server()->SetClocks({42, 41, 42});
  Node(job.servers(1))->server()->SetClocks({42, 40, 42});
  ASSERT_THAT(Report(id, 0, 42, false), IsOk());
  ASSERT_THAT(Report(id, 1, 40, false), IsOk());
  ASSERT_THAT(Report(id, 2, 42, false), IsOk());
  Leave(workers[1]);
  sched_->RunOnce();

  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().recoveries(), 0u);
  EXPECT_EQ(job.recovery().handovers(), 0u);
  EXPECT_EQ(job.progress().rolled_back_to_step(), -1);
  ASSERT_THAT(job.recovery().left(), SizeIs(1));
  const v1::LeftRank& left = job.recovery().left(0);
  EXPECT_EQ(left.rank(), 1u);
  EXPECT_EQ(left.node_id(), workers[1]);
  EXPECT_EQ(left.step(), 40) << "its lowest clock on the servers";
  EXPECT_EQ(left.adopted_by(), 0u);
  EXPECT_THAT(left.cause(), HasSubstr(absl::StrCat("worker of rank 1 ", workers[1])));
  EXPECT_EQ(job.workers(1), "");
  EXPECT_EQ(job.workers(0), workers[0]);
  EXPECT_EQ(job.workers(2), workers[2]);
  EXPECT_TRUE(job.progress().workers(1).left());
  EXPECT_TRUE(job.progress().workers(1).done());
  EXPECT_EQ(job.progress().step(), 42) << "the job's step leaves out the rank that left";
  // Every server took the rank out of the barrier.
  for (const std::string& s : job.servers()) {
    auto fences = Node(s)->server()->fences();
    ASSERT_THAT(fences, SizeIs(1)) << s;
    EXPECT_TRUE(fences[0].leave());
    EXPECT_EQ(fences[0].worker(), 1u);
    EXPECT_THAT(Node(s)->server()->dropped(), IsEmpty());
    EXPECT_THAT(Node(s)->server()->updates(), SizeIs(1)) << "no new map";
  }
  // Rank 0 reads rank 1's part from now on; rank 2 is told nothing; no task was stopped.
  auto updates = Node(workers[0])->worker()->partition_updates();
  ASSERT_THAT(updates, SizeIs(1));
  EXPECT_EQ(updates[0].rank(), 0u);
  EXPECT_EQ(updates[0].attempt(), 0u);
  EXPECT_EQ(updates[0].partition().index(), 0u);
  EXPECT_EQ(updates[0].partition().count(), 3u);
  EXPECT_THAT(updates[0].partition().also(), ElementsAre(1u));
  EXPECT_EQ(updates[0].lead_rank(), 0u);
  EXPECT_EQ(updates[0].training_ranks(), 2u);
  EXPECT_THAT(Node(workers[2])->worker()->partition_updates(), IsEmpty());
  for (const std::string& w : {workers[0], workers[2]}) {
    EXPECT_THAT(Node(w)->worker()->stopped(), IsEmpty());
    EXPECT_THAT(Node(w)->worker()->assigned(), SizeIs(1));
  }
  // The lost rank's reports are ignored now, whoever sends them.
  auto stale = Report(id, 1, 41, false);
  ASSERT_THAT(stale, IsOk());
  EXPECT_TRUE(*stale);
  EXPECT_TRUE(Get(id).progress().workers(1).left());

  // Rank 0 is lost too: its part and rank 1's go to rank 2, which now leads.
  Leave(workers[0]);
  sched_->RunOnce();
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  ASSERT_THAT(job.recovery().left(), SizeIs(2));
  EXPECT_EQ(job.recovery().left(0).adopted_by(), 2u);
  EXPECT_EQ(job.recovery().left(1).rank(), 0u);
  EXPECT_EQ(job.recovery().left(1).adopted_by(), 2u);
  updates = Node(workers[2])->worker()->partition_updates();
  ASSERT_THAT(updates, SizeIs(1));
  EXPECT_THAT(updates[0].partition().also(), ::testing::UnorderedElementsAre(0u, 1u));
  EXPECT_EQ(updates[0].lead_rank(), 2u);
  // A worker joins, and rank 2's worker is lost: the rank is handed over (an idle worker is
  // there), and its new task reads the same parts and leads.
  const std::string spare = AddNode(v1::ROLE_WORKER);
  Leave(workers[2]);
  sched_->RunOnce();
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().handovers(), 1u);
  EXPECT_EQ(job.workers(2), spare);
  auto assigned = Node(spare)->worker()->assigned();
  ASSERT_THAT(assigned, SizeIs(1));
  EXPECT_EQ(assigned[0].rank(), 2u);
  EXPECT_EQ(assigned[0].start_step(), 42);
  EXPECT_THAT(assigned[0].partition().also(), ::testing::UnorderedElementsAre(0u, 1u));
  EXPECT_EQ(assigned[0].lead_rank(), 2u);
  EXPECT_EQ(assigned[0].training_ranks(), 1u);

  // The last rank finishes: the job succeeds with the model rank 2 exported.
  auto done = Report(id, 2, 10, true, "", "/tmp/m.safetensors", assigned[0].attempt());
  ASSERT_THAT(done, IsOk());
  job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.export_path(), "/tmp/m.safetensors");

  // The record survives a scheduler restart.
  StartScheduler();
  EXPECT_THAT(Get(id).recovery().left(), SizeIs(2));
}

// The scheduler stops after recording that a rank leaves and before the servers were told: at
// its next start it tells them (the barrier would otherwise wait for the rank for ever).
TEST_F(SchedulerTest, ALeavingInterruptedByARestartIsFinishedAtTheNextStart) {
  AddCluster(2, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &id));
  v1::Job job = Get(id);
  for (const std::string& s : job.servers()) Node(s)->server()->SetClocks({80, 77});
  Leave(job.workers(1));
  sched_->RunOnce();
  job = Get(id);
  ASSERT_THAT(job.recovery().left(), SizeIs(1));
  ASSERT_EQ(job.recovery().left(0).step(), 77);
  // As the record stood half-way: leaving recorded, servers not told yet.
  job.mutable_recovery()->mutable_left(0)->set_step(-1);
  const v1::ShardMap map = MapOf(id);
  sched_.reset();
  ASSERT_THAT(store_->PutJob(job, "", &map), IsOk());
  StartScheduler();
  BeatAll();
  sched_->RunOnce();
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  ASSERT_THAT(job.recovery().left(), SizeIs(1));
  EXPECT_EQ(job.recovery().left(0).step(), 77);
  for (const std::string& s : job.servers()) {
    auto fences = Node(s)->server()->fences();
    ASSERT_THAT(fences, SizeIs(2)) << s;
    EXPECT_TRUE(fences[1].leave());
    EXPECT_EQ(fences[1].worker(), 1u);
  }
}

// With aggregate steps every remaining rank learns how many ranks train, so that each step still
// applies the mean of their gradients.
TEST_F(SchedulerTest, WithAggregateStepsEveryRemainingRankLearnsHowManyTrain) {
  AddCluster(2, 3);
  auto id = Submit(absl::StrReplaceAll(
      kJob, {{"num_workers: 2", "num_workers: 3"}, {"{mode: bsp}", "{mode: bsp, aggregate: true}"}}));
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  ASSERT_TRUE(job.spec().consistency().aggregate());
  const std::vector<std::string> workers(job.workers().begin(), job.workers().end());
  Leave(workers[1]);
  sched_->RunOnce();
  ASSERT_THAT(Get(*id).recovery().left(), SizeIs(1));
  for (const std::string& w : {workers[0], workers[2]}) {
    auto updates = Node(w)->worker()->partition_updates();
    ASSERT_THAT(updates, SizeIs(1)) << w;
    EXPECT_EQ(updates[0].training_ranks(), 2u);
    EXPECT_EQ(updates[0].lead_rank(), 0u);
  }
  EXPECT_THAT(Node(workers[0])->worker()->partition_updates()[0].partition().also(),
              ElementsAre(1u));
  EXPECT_THAT(Node(workers[2])->worker()->partition_updates()[0].partition().also(), IsEmpty());
}

// A worker becomes idle (a new one, or the lost one restarted): a rank that left the job comes
// back on it, at the slowest clock of the ranks training, reading its own part again.
TEST_F(SchedulerTest, ARankThatLeftRejoinsOnAWorkerThatBecomesIdle) {
  AddCluster(2, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &id));
  v1::Job job = Get(id);
  const std::string kept = job.workers(0);
  Leave(job.workers(1));
  sched_->RunOnce();
  job = Get(id);
  ASSERT_THAT(job.recovery().left(), SizeIs(1));
  ASSERT_THAT(Node(kept)->worker()->partition_updates(), SizeIs(1));
  for (const std::string& s : job.servers()) Node(s)->server()->SetClocks({57, 30});

  // A queued job gets idle workers first.
  auto queued = Submit(absl::StrReplaceAll(kJob, {{"num_workers: 2", "num_workers: 1"}}));
  ASSERT_THAT(queued, IsOk());
  const std::string spare = AddNode(v1::ROLE_WORKER);
  sched_->RunOnce();
  EXPECT_EQ(Get(*queued).state(), v1::JOB_RUNNING);
  EXPECT_THAT(Get(id).recovery().left(), SizeIs(1)) << "no idle worker was left for it";
  ASSERT_THAT(Report(*queued, 0, 10, true, "", "/tmp/m.safetensors"), IsOk());
  FinishTasks(*queued);
  sched_->RunOnce();

  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_THAT(job.recovery().left(), IsEmpty());
  EXPECT_EQ(job.workers(1), spare);
  EXPECT_FALSE(job.progress().workers(1).left());
  EXPECT_FALSE(job.progress().workers(1).done());
  EXPECT_EQ(job.recovery().recoveries(), 0u);
  EXPECT_EQ(job.recovery().rejoins(), 1u);
  auto assigned = Node(spare)->worker()->assigned();
  ASSERT_THAT(assigned, SizeIs(2));  // The queued job's task, then rank 1's.
  EXPECT_EQ(assigned[1].job_id(), id);
  EXPECT_EQ(assigned[1].rank(), 1u);
  EXPECT_EQ(assigned[1].start_step(), 57) << "the slowest clock of the ranks training";
  EXPECT_EQ(assigned[1].attempt(), job.recovery().rank_attempts(1));
  EXPECT_GT(assigned[1].attempt(), 1u) << "above the attempt it left with";
  EXPECT_THAT(assigned[1].partition().also(), IsEmpty());
  EXPECT_EQ(assigned[1].lead_rank(), 0u);
  EXPECT_EQ(assigned[1].training_ranks(), 2u);
  for (const std::string& s : job.servers()) {
    auto fences = Node(s)->server()->fences();
    ASSERT_THAT(fences, SizeIs(2)) << s;
    EXPECT_TRUE(fences[1].rejoin());
    EXPECT_EQ(fences[1].worker(), 1u);
    EXPECT_EQ(fences[1].attempt(), assigned[1].attempt());
  }
  // Rank 0 no longer reads rank 1's part.
  auto updates = Node(kept)->worker()->partition_updates();
  ASSERT_THAT(updates, SizeIs(2));
  EXPECT_THAT(updates[1].partition().also(), IsEmpty());
  // Its reports count again.
  auto on = Report(id, 1, 60, false, "", "", assigned[1].attempt());
  ASSERT_THAT(on, IsOk());
  EXPECT_FALSE(*on);
  EXPECT_EQ(Get(id).progress().workers(1).step(), 60);
}

// Data balancing: a job with balance_data gives its faster rank a larger part once both ranks
// have reported their compute rates, tells every rank, keeps the shares for a rank handed to
// another worker and across a scheduler restart, pauses while a rank has left, and starts again
// from equal parts after a rollback.
TEST_F(SchedulerTest, DataSharesFollowTheRanksComputeRates) {
  AddCluster(2, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrCat(kJob, "balance_data: true\n"), &id));
  v1::Job job = Get(id);
  auto report = [&](uint32_t rank, int64_t step, double rate) {
    v1::ReportProgressRequest req;
    req.set_job_id(id);
    v1::WorkerProgress* p = req.mutable_progress();
    p->set_rank(rank);
    p->set_attempt(Get(id).recovery().rank_attempts_size() > static_cast<int>(rank)
                       ? Get(id).recovery().rank_attempts(rank)
                       : Get(id).recovery().recoveries());
    p->set_step(step);
    p->set_total_steps(1000);
    p->set_compute_rate(rate);
    v1::ReportProgressResponse resp;
    ASSERT_THAT(sched_->ReportProgress(req, &resp), IsOk());
    ASSERT_FALSE(resp.cancel());
  };
  auto updates = [&](int rank) {
    return Node(Get(id).workers(rank))->worker()->partition_updates();
  };
  // Not before the job has run `every`.
  report(0, 5, 3000);
  report(1, 5, 1000);
  clock_.Advance(options_.data_balance.every / 2);
  BeatAll();
  sched_->RunOnce();
  EXPECT_THAT(updates(0), IsEmpty());
  clock_.Advance(options_.data_balance.every / 2);
  BeatAll();
  sched_->RunOnce();
  job = Get(id);
  EXPECT_THAT(job.recovery().data_shares(), ElementsAre(1500, 500));
  EXPECT_EQ(job.recovery().rebalances(), 1u);
  for (int q = 0; q < 2; ++q) {
    auto u = updates(q);
    ASSERT_THAT(u, SizeIs(1)) << "rank " << q;
    EXPECT_EQ(u[0].rank(), static_cast<uint32_t>(q));
    EXPECT_EQ(u[0].partition().index(), static_cast<uint32_t>(q));
    EXPECT_EQ(u[0].partition().count(), 2u);
    EXPECT_THAT(u[0].partition().shares(), ElementsAre(1500, 500));
    EXPECT_THAT(u[0].partition().also(), IsEmpty());
    EXPECT_EQ(u[0].training_ranks(), 2u);
  }
  EXPECT_THAT(sched_->RenderMetrics(), HasSubstr("pscluster_scheduler_data_rebalances_total 1"));
  // No report since the change: nothing is measured yet with the new parts.
  clock_.Advance(options_.data_balance.every);
  BeatAll();
  sched_->RunOnce();
  EXPECT_THAT(updates(0), SizeIs(1));
  // Rates that the new parts fit: nothing changes.
  report(0, 50, 3100);
  report(1, 50, 1000);
  clock_.Advance(options_.data_balance.every);
  BeatAll();
  sched_->RunOnce();
  EXPECT_THAT(updates(0), SizeIs(1));
  EXPECT_EQ(Get(id).recovery().rebalances(), 1u);

  // The shares survive a restart, and a rank handed to another worker keeps its part.
  StartScheduler();
  EXPECT_THAT(Get(id).recovery().data_shares(), ElementsAre(1500, 500));
  const std::string spare = AddNode(v1::ROLE_WORKER);
  clock_.Advance(options_.startup_grace);
  BeatAll();
  sched_->RunOnce();
  job = Get(id);
  for (const std::string& srv : job.servers()) Node(srv)->server()->SetClocks({60, 50});
  Leave(job.workers(1));
  sched_->RunOnce();
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  ASSERT_EQ(job.workers(1), spare);
  EXPECT_EQ(job.recovery().handovers(), 1u);
  auto assigned = Node(spare)->worker()->assigned();
  ASSERT_THAT(assigned, SizeIs(1));
  EXPECT_THAT(assigned[0].partition().shares(), ElementsAre(1500, 500));

  // A rank that leaves: its part, with its share, goes to the other rank, and the shares stay
  // as they are while it is away, whatever the rates say.
  Leave(job.workers(1));
  sched_->RunOnce();
  job = Get(id);
  ASSERT_THAT(job.recovery().left(), SizeIs(1));
  auto u0 = updates(0);
  ASSERT_THAT(u0, SizeIs(2));
  EXPECT_THAT(u0[1].partition().shares(), ElementsAre(1500, 500));
  EXPECT_THAT(u0[1].partition().also(), ElementsAre(1));
  report(0, 80, 500);
  clock_.Advance(options_.data_balance.every);
  BeatAll();
  sched_->RunOnce();
  EXPECT_THAT(updates(0), SizeIs(2));
  EXPECT_THAT(Get(id).recovery().data_shares(), ElementsAre(1500, 500));

  // A rollback places the job again, possibly elsewhere: equal parts until measured again.
  Leave(job.servers(0));
  for (int i = 0; i < 5 && Get(id).state() != v1::JOB_RUNNING; ++i) {
    clock_.Advance(absl::Seconds(3));
    BeatAll();
    sched_->RunOnce();
  }
  AddNode(v1::ROLE_SERVER);
  AddNode(v1::ROLE_WORKER);
  for (int i = 0; i < 5 && Get(id).state() != v1::JOB_RUNNING; ++i) {
    clock_.Advance(absl::Seconds(3));
    BeatAll();
    sched_->RunOnce();
  }
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().recoveries(), 1u);
  EXPECT_THAT(job.recovery().data_shares(), IsEmpty());
  for (int q = 0; q < 2; ++q) {
    auto a = Node(job.workers(q))->worker()->assigned();
    ASSERT_FALSE(a.empty());
    EXPECT_THAT(a.back().partition().shares(), IsEmpty()) << "rank " << q;
  }
}

// Without balance_data the parts stay equal, whatever the rates.
TEST_F(SchedulerTest, DataSharesStayEqualWithoutBalanceData) {
  AddCluster(2, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &id));
  v1::Job job = Get(id);
  for (uint32_t q = 0; q < 2; ++q) {
    v1::ReportProgressRequest req;
    req.set_job_id(id);
    req.mutable_progress()->set_rank(q);
    req.mutable_progress()->set_step(5);
    req.mutable_progress()->set_compute_rate(q == 0 ? 5000 : 100);
    v1::ReportProgressResponse resp;
    ASSERT_THAT(sched_->ReportProgress(req, &resp), IsOk());
  }
  clock_.Advance(options_.data_balance.every * 2);
  BeatAll();
  sched_->RunOnce();
  EXPECT_THAT(Get(id).recovery().data_shares(), IsEmpty());
  for (const std::string& w : job.workers()) {
    EXPECT_THAT(Node(w)->worker()->partition_updates(), IsEmpty());
  }
  // A bad rate is refused, naming the field.
  v1::ReportProgressRequest bad;
  bad.set_job_id(id);
  bad.mutable_progress()->set_compute_rate(-1);
  v1::ReportProgressResponse resp;
  EXPECT_THAT(sched_->ReportProgress(bad, &resp),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("progress.compute_rate")));
}

// A primary that cannot deliver copies to its backup (a partition between the two servers, both
// alive) says so in its status; the scheduler drops that backup from the map, so that the
// primary's pushes go through again, and no task stops.
// With a third server, the shards that lost their backup get a new one there: a live copy that
// the primary seeds, with no task stopped; the server the primary cannot reach is never paired
// with it again.
TEST_F(SchedulerTest, ADroppedBackupIsReplacedOnAServerThePrimaryReaches) {
  AddCluster(3, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrReplaceAll(absl::StrCat(kJob, "replication: 2\n"),
                                                       {{"num_servers: 2", "num_servers: 3"}}),
                                   &id));
  v1::Job job = Get(id);
  const v1::ShardMap before = MapOf(id);
  ASSERT_EQ(before.servers_size(), 3);
  const std::string p = before.assignments(0).primary();
  ASSERT_THAT(before.assignments(0).backups(), SizeIs(1));
  const std::string b = before.assignments(0).backups(0);
  std::string c;
  for (const v1::ServerEndpoint& ep : before.servers()) {
    if (ep.node_id() != p && ep.node_id() != b) c = ep.node_id();
  }
  ASSERT_FALSE(c.empty());
  const size_t c_updates = Node(c)->server()->updates().size();
  Node(p)->server()->SetUnreachableBackups({Node(b)->address()});
  clock_.Advance(options_.status_poll_interval);
  BeatAll();
  sched_->RunOnce();  // The poll sees it.
  sched_->RunOnce();  // The control pass drops b and gives p's shards a new backup.

  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  const v1::ShardMap after = MapOf(id);
  EXPECT_EQ(after.epoch(), before.epoch() + 2) << "one map drops, one adds";
  EXPECT_EQ(job.shard_map_epoch(), after.epoch());
  for (const v1::ShardAssignment& a : after.assignments()) {
    EXPECT_EQ(a.primary(), before.assignments(a.shard()).primary());
    ASSERT_THAT(a.backups(), SizeIs(1)) << "shard " << a.shard();
    if (a.primary() == p) {
      EXPECT_EQ(a.backups(0), c) << "shard " << a.shard();
    } else {
      EXPECT_EQ(a.backups(0), before.assignments(a.shard()).backups(0)) << "shard " << a.shard();
    }
  }
  // c takes the map with a live seed from p; every server learns to seed its new backups.
  auto updates = Node(c)->server()->updates();
  ASSERT_GT(updates.size(), c_updates);
  const v1::UpdateShardMapRequest& to_c = updates.back();
  EXPECT_EQ(to_c.map().epoch(), after.epoch());
  ASSERT_EQ(to_c.copy_from_size(), 1);
  EXPECT_EQ(to_c.copy_from(0).primary(), p);
  EXPECT_TRUE(to_c.copy_from(0).live());
  for (const std::string& s : {p, b, c}) {
    const v1::UpdateShardMapRequest u = Node(s)->server()->updates().back();
    EXPECT_EQ(u.map().epoch(), after.epoch()) << s;
    EXPECT_TRUE(u.seed_new_backups()) << s;
    EXPECT_EQ(u.min_attempt(), 0u) << "no task is fenced";
    if (s != c) {
      EXPECT_THAT(u.copy_from(), IsEmpty()) << s;
    }
  }
  for (const std::string& w : job.workers()) EXPECT_THAT(Node(w)->worker()->stopped(), IsEmpty());
  EXPECT_EQ(job.recovery().recoveries(), 0u);
  EXPECT_THAT(sched_->RenderMetrics(), HasSubstr("pscluster_scheduler_backups_replaced_total 1"));
  // Nothing more to do: no new map.
  clock_.Advance(options_.status_poll_interval);
  BeatAll();
  sched_->RunOnce();
  sched_->RunOnce();
  EXPECT_EQ(MapOf(id).epoch(), after.epoch());
  ASSERT_EQ(job.recovery().cut_backups_size(), 1);
  EXPECT_EQ(job.recovery().cut_backups(0).primary(), p);
  EXPECT_EQ(job.recovery().cut_backups(0).backup(), b);
}

// With two servers there is no other server: the shards go on with a copy fewer, and the
// server the primary was cut from is not given back to it, not even by a restarted scheduler.
TEST_F(SchedulerTest, ACutBackupIsNotGivenBackAfterARestart) {
  AddCluster(2, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrCat(kJob, "replication: 2\n"), &id));
  const v1::ShardMap before = MapOf(id);
  const std::string p = before.assignments(0).primary();
  const std::string b = before.assignments(0).backups(0);
  Node(p)->server()->SetUnreachableBackups({Node(b)->address()});
  clock_.Advance(options_.status_poll_interval);
  BeatAll();
  sched_->RunOnce();
  sched_->RunOnce();
  Node(p)->server()->SetUnreachableBackups({});
  const uint64_t dropped = MapOf(id).epoch();
  EXPECT_EQ(dropped, before.epoch() + 1);
  StartScheduler();
  clock_.Advance(options_.startup_grace + options_.status_poll_interval);
  BeatAll();
  for (int i = 0; i < 3; ++i) sched_->RunOnce();
  EXPECT_EQ(Get(id).state(), v1::JOB_RUNNING);
  EXPECT_EQ(MapOf(id).epoch(), dropped) << "no map gives b back to p";
  const v1::ShardMap now = MapOf(id);
  for (const v1::ShardAssignment& a : now.assignments()) {
    if (a.primary() == p) {
      EXPECT_THAT(a.backups(), IsEmpty()) << "shard " << a.shard();
    }
  }
}

TEST_F(SchedulerTest, ABackupItsPrimaryCannotReachIsDroppedFromTheMap) {
  AddCluster(2, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrCat(kJob, "replication: 2\n"), &id));
  v1::Job job = Get(id);
  const v1::ShardMap before = MapOf(id);
  const std::string p = job.servers(0), b = job.servers(1);
  size_t of_p = 0;
  for (const v1::ShardAssignment& a : before.assignments()) {
    ASSERT_THAT(a.backups(), SizeIs(1));
    of_p += a.primary() == p ? 1 : 0;
  }
  ASSERT_GT(of_p, 0u);
  Node(p)->server()->SetUnreachableBackups({Node(b)->address()});
  clock_.Advance(options_.status_poll_interval);
  BeatAll();
  sched_->RunOnce();  // The poll sees it.
  sched_->RunOnce();  // The control pass acts on it.

  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  const v1::ShardMap after = MapOf(id);
  EXPECT_EQ(after.epoch(), before.epoch() + 1);
  EXPECT_EQ(job.shard_map_epoch(), after.epoch());
  for (const v1::ShardAssignment& a : after.assignments()) {
    EXPECT_EQ(a.primary(), before.assignments(a.shard()).primary());
    if (a.primary() == p) {
      EXPECT_THAT(a.backups(), IsEmpty()) << "shard " << a.shard();
    } else {
      EXPECT_THAT(a.backups(), ElementsAre(p)) << "shard " << a.shard();
    }
  }
  for (const std::string& s : {p, b}) {
    const v1::UpdateShardMapRequest u = Node(s)->server()->updates().back();
    EXPECT_EQ(u.map().epoch(), after.epoch()) << s;
    EXPECT_EQ(u.min_attempt(), 0u) << "no task is fenced";
  }
  for (const std::string& w : job.workers()) EXPECT_THAT(Node(w)->worker()->stopped(), IsEmpty());
  EXPECT_EQ(job.recovery().recoveries(), 0u);
  // Reported again (the status lags): nothing more to drop, no new map.
  clock_.Advance(options_.status_poll_interval);
  BeatAll();
  sched_->RunOnce();
  sched_->RunOnce();
  EXPECT_EQ(MapOf(id).epoch(), after.epoch());
}

// min_workers: below it, a lost rank with no idle worker rolls the job back instead (and the
// job waits to be placed again on num_workers workers).
TEST_F(SchedulerTest, BelowMinWorkersALostRankRollsTheJobBackInstead) {
  AddCluster(2, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrCat(kJob, "min_workers: 2\n"), &id));
  v1::Job job = Get(id);
  const std::string lost = job.workers(1);
  Leave(lost);
  sched_->RunOnce();
  job = Get(id);
  EXPECT_NE(job.state(), v1::JOB_RUNNING);
  EXPECT_EQ(job.recovery().recoveries(), 1u);
  EXPECT_THAT(job.recovery().left(), IsEmpty());
  EXPECT_THAT(job.recovery().last_cause(), HasSubstr("no idle worker to take its rank"));
  EXPECT_THAT(job.reason(), HasSubstr("needs 2 idle workers, 1 available"));
  for (const std::string& s : job.servers()) {
    for (const auto& f : Node(s)->server()->fences()) EXPECT_FALSE(f.leave());
  }
  // min_workers above num_workers is refused, naming the field.
  EXPECT_THAT(Submit(absl::StrCat(kJob, "min_workers: 3\n")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("min_workers: must be at most num_workers (2)")));
}

TEST_F(SchedulerTest, ARestartedWorkerTakesItsOwnRankBack) {
  AddCluster(1, 1);
  auto id = Submit(absl::StrReplaceAll(kJob, {{"num_workers: 2", "num_workers: 1"},
                                              {"num_servers: 2", "num_servers: 1"}}));
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  ASSERT_EQ(Get(*id).state(), v1::JOB_RUNNING);
  Node(ids_[0])->server()->SetClocks({17});
  Node(ids_[1])->worker()->FinishTask();  // The old process is gone, and its task with it.
  v1::RegisterNodeRequest req;
  req.mutable_node()->set_role(v1::ROLE_WORKER);
  req.mutable_node()->set_address(Node(ids_[1])->address());
  req.mutable_node()->set_pid(4242);  // A new process at the same address.
  v1::RegisterNodeResponse resp;
  ASSERT_THAT(sched_->RegisterNode(req, &resp), IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().handovers(), 1u);
  EXPECT_THAT(job.recovery().last_cause(), HasSubstr("restarted"));
  EXPECT_EQ(job.workers(0), ids_[1]);
  auto assigned = Node(ids_[1])->worker()->assigned();
  ASSERT_THAT(assigned, SizeIs(2));
  EXPECT_EQ(assigned[1].start_step(), 17);
}

TEST_F(SchedulerTest, ALostRankThatCannotBeHandedOverRollsTheJobBackOntoASpare) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/ckpt-worker";
  AddCluster(2, 3);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(CheckpointedJob(dir), &id));
  v1::Job job = Get(id);
  v1::ShardMap map = MapOf(id);
  std::vector<std::string> files;
  for (int64_t step : {10, 20}) {
    for (const std::string& s : job.servers()) files.push_back(WriteCheckpoint(dir, map, s, step));
  }
  const std::string lost = job.workers(1);
  const std::string kept = job.workers(0);

  AdvanceWithout(lost, absl::Seconds(6));
  AdvanceWithout(lost, absl::Seconds(5));
  ASSERT_EQ(sched_->registry().Get(lost)->state(), v1::NODE_DEAD);

  // One control pass stopped the job, rolled it back and placed it again.
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().recoveries(), 1u);
  EXPECT_EQ(job.recovery().start_step(), 20);
  EXPECT_EQ(job.progress().rolled_back_to_step(), 20);
  EXPECT_THAT(job.recovery().last_cause(),
              HasSubstr(absl::StrCat("worker of rank 1 ", lost, " at ", Node(lost)->address(),
                                     " stopped heartbeating")));
  // These stand-in servers report no clocks, so where the rank stood is unknown.
  EXPECT_THAT(job.recovery().last_cause(),
              HasSubstr("its rank could not be handed over (server server-"));
  EXPECT_EQ(job.recovery().handovers(), 0u);
  EXPECT_EQ(job.shard_map_epoch(), map.epoch() + 1);
  ASSERT_THAT(job.workers(), SizeIs(2));
  EXPECT_THAT(job.workers(), ::testing::Not(::testing::Contains(lost)));
  // The surviving worker's task was stopped before it got the new one.
  EXPECT_THAT(Node(kept)->worker()->stopped(), SizeIs(1));
  for (int rank = 0; rank < 2; ++rank) {
    auto assigned = Node(job.workers(rank))->worker()->assigned();
    ASSERT_FALSE(assigned.empty());
    EXPECT_EQ(assigned.back().start_step(), 20);
    // Above every earlier task's, the failed hand-over's (1) included.
    EXPECT_EQ(assigned.back().attempt(), 2u);
    EXPECT_EQ(assigned.back().rank(), static_cast<uint32_t>(rank));
    EXPECT_EQ(assigned.back().shard_map().epoch(), job.shard_map_epoch());
  }
  // Every server dropped the old run and restores its shards from the step-20 files.
  std::vector<std::string> restored;
  for (const std::string& s : job.servers()) {
    FakeParameterServer* ps = Node(s)->server();
    EXPECT_THAT(ps->dropped(), ElementsAre(id));
    const v1::UpdateShardMapRequest u = ps->updates().back();
    EXPECT_EQ(u.map().epoch(), job.shard_map_epoch());
    EXPECT_EQ(u.restore_step(), 20);
    EXPECT_EQ(u.min_attempt(), 2u);  // The old run's tasks are fenced off.
    for (const std::string& f : u.restore_from()) {
      EXPECT_THAT(f, HasSubstr("-step20.ckpt"));
      restored.push_back(f);
    }
  }
  EXPECT_THAT(restored, ::testing::UnorderedElementsAre(files[2], files[3]));

  // The replaced task's reports are moot; the new ones count.
  auto cancel = Report(id, 0, 25, false, "lost its server");
  ASSERT_THAT(cancel, IsOk());
  EXPECT_TRUE(*cancel);
  EXPECT_EQ(Get(id).state(), v1::JOB_RUNNING);
  cancel = Report(id, 0, 25, false, "", "", 2);
  ASSERT_THAT(cancel, IsOk());
  EXPECT_FALSE(*cancel);
  EXPECT_EQ(Get(id).progress().workers(0).step(), 25);
}

TEST_F(SchedulerTest, ALostServersShardsAreRestoredOnASpareServer) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/ckpt-server";
  AddCluster(3, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(CheckpointedJob(dir), &id));
  v1::Job job = Get(id);
  v1::ShardMap map = MapOf(id);
  for (const std::string& s : job.servers()) WriteCheckpoint(dir, map, s, 30);
  // The first server dies; the second one got as far as step 40 (its file is not enough).
  WriteCheckpoint(dir, map, job.servers(1), 40);
  const std::string lost = job.servers(0);
  Leave(lost);
  EXPECT_EQ(Get(id).state(), v1::JOB_RECOVERING);
  EXPECT_THAT(Get(id).reason(), HasSubstr("left the cluster"));

  // A scheduler restart in the middle of a recovery carries it on.
  StartScheduler();
  EXPECT_EQ(Get(id).state(), v1::JOB_RECOVERING);
  BeatAll();
  sched_->RunOnce();
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().start_step(), 30);
  EXPECT_THAT(job.servers(), ::testing::Not(::testing::Contains(lost)));
  map = MapOf(id);
  EXPECT_GT(map.epoch(), 1u);
  for (const auto& a : map.assignments()) EXPECT_NE(a.primary(), lost);
  // Each server restores exactly the files holding a shard it holds now, all of step 30.
  std::set<std::string> needed;
  for (const std::string& s : job.servers()) {
    const v1::UpdateShardMapRequest u = Node(s)->server()->updates().back();
    EXPECT_EQ(u.restore_step(), 30);
    ASSERT_FALSE(u.restore_from().empty()) << s;
    for (const std::string& f : u.restore_from()) {
      EXPECT_THAT(f, HasSubstr("-step30.ckpt"));
      needed.insert(f);
    }
  }
  EXPECT_THAT(needed, SizeIs(2));
}

// replication: 2: every shard has a backup on the other server. When one server is lost, its
// shards' backups take over: no rollback, no DropJob, no checkpoint files; every rank resumes on
// its worker at its lowest clock on the servers, fenced at a new attempt.
TEST_F(SchedulerTest, ALostServersBackupsTakeOverWithNoRollback) {
  AddCluster(2, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrCat(kJob, "replication: 2\n"), &id));
  v1::Job job = Get(id);
  v1::ShardMap map = MapOf(id);
  for (const auto& a : map.assignments()) ASSERT_THAT(a.backups(), SizeIs(1));
  const std::string lost = job.servers(0), kept = job.servers(1);
  // The survivor: rank 0 finished step 12, rank 1 is half-way through step 12.
  Node(kept)->server()->SetClocks({12, 11});
  const std::vector<std::string> workers(job.workers().begin(), job.workers().end());
  Leave(lost);
  EXPECT_EQ(Get(id).state(), v1::JOB_RECOVERING);
  sched_->RunOnce();

  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().promotions(), 1u);
  EXPECT_EQ(job.recovery().recoveries(), 0u);
  EXPECT_EQ(job.recovery().handovers(), 0u);
  EXPECT_EQ(job.progress().rolled_back_to_step(), -1);
  EXPECT_THAT(job.reason(), HasSubstr("its shards' backups took over"));
  EXPECT_THAT(job.recovery().last_cause(), HasSubstr(absl::StrCat("server holding shards ", lost)));
  EXPECT_THAT(job.servers(), ElementsAre(kept));
  EXPECT_THAT(std::vector<std::string>(job.workers().begin(), job.workers().end()),
              ::testing::ElementsAreArray(workers));
  // The survivor got the map that makes it primary of everything, and kept the job.
  const v1::ShardMap next = MapOf(id);
  EXPECT_EQ(next.epoch(), map.epoch() + 1);
  for (const auto& a : next.assignments()) {
    EXPECT_EQ(a.primary(), kept);
    EXPECT_THAT(a.backups(), IsEmpty());
  }
  EXPECT_THAT(Node(kept)->server()->dropped(), IsEmpty());
  const v1::UpdateShardMapRequest u = Node(kept)->server()->updates().back();
  EXPECT_EQ(u.map().epoch(), next.epoch());
  EXPECT_EQ(u.self(), kept);
  EXPECT_THAT(u.restore_from(), IsEmpty());
  EXPECT_EQ(u.restore_step(), 0);
  EXPECT_EQ(u.min_attempt(), 1u);
  // Each worker's task was stopped, then given again from the rank's lowest clock.
  for (int rank = 0; rank < 2; ++rank) {
    FakeWorker* w = Node(workers[rank])->worker();
    EXPECT_THAT(w->stopped(), SizeIs(1));
    auto assigned = w->assigned();
    ASSERT_THAT(assigned, SizeIs(2));
    EXPECT_EQ(assigned[1].rank(), static_cast<uint32_t>(rank));
    EXPECT_EQ(assigned[1].start_step(), rank == 0 ? 12 : 11);
    EXPECT_EQ(assigned[1].attempt(), 1u);
    EXPECT_EQ(assigned[1].shard_map().epoch(), next.epoch());
  }
  auto cancel = Report(id, 1, 13, false, "", "", 1);
  ASSERT_THAT(cancel, IsOk());
  EXPECT_FALSE(*cancel);
  EXPECT_TRUE(*Report(id, 1, 13, false, "", "", 0)) << "the old attempt is moot";
  EXPECT_THAT(sched_->RenderMetrics(), HasSubstr("pscluster_scheduler_backup_promotions_total 1"));
}

// With three servers, the shards that lost a copy with the dead server get a new backup on a
// survivor: a live copy that their primary seeds (no checkpoint_dir needed).
TEST_F(SchedulerTest, AfterAPromotionTheShardsThatLostACopyGetANewOne) {
  AddCluster(3, 2);
  auto id = Submit(absl::StrCat(
      absl::StrReplaceAll(kJob, {{"num_servers: 2", "num_servers: 3"}}), "replication: 2\n"));
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  const v1::ShardMap map = MapOf(*id);
  const std::string lost = job.servers(0);
  for (const std::string& s : job.servers()) Node(s)->server()->SetClocks({7, 7});
  Leave(lost);
  sched_->RunOnce();

  job = Get(*id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().promotions(), 1u);
  EXPECT_EQ(job.recovery().recoveries(), 0u);
  const v1::ShardMap now = MapOf(*id);
  EXPECT_EQ(now.epoch(), map.epoch() + 2) << "promoted, then the new copies";
  for (const auto& a : now.assignments()) {
    EXPECT_NE(a.primary(), lost);
    ASSERT_THAT(a.backups(), SizeIs(1)) << "shard " << a.shard();
    EXPECT_NE(a.backups(0), a.primary());
    EXPECT_NE(a.backups(0), lost);
  }
  // Every survivor that backs up shards it did not back up before takes a live copy of them,
  // and every primary is asked to seed its new backups: no checkpoint file is involved.
  int seeds = 0;
  for (const std::string& s : job.servers()) {
    const v1::UpdateShardMapRequest u = Node(s)->server()->updates().back();
    EXPECT_EQ(u.map().epoch(), now.epoch());
    EXPECT_TRUE(u.seed_new_backups());
    for (const v1::ReplicaSeed& seed : u.copy_from()) {
      ++seeds;
      EXPECT_NE(seed.primary(), s);
      EXPECT_TRUE(seed.live());
      EXPECT_THAT(seed.path(), IsEmpty());
    }
    EXPECT_THAT(Node(s)->server()->checkpoints(), IsEmpty());
  }
  EXPECT_GE(seeds, 1);
  // The tasks got the final map.
  for (const std::string& w : job.workers()) {
    EXPECT_EQ(Node(w)->worker()->assigned().back().shard_map().epoch(), now.epoch());
  }
}

// Without a live copy of every shard the lost server was primary of, the job rolls back.
TEST_F(SchedulerTest, WithoutALiveBackupALostServersJobRollsBack) {
  AddCluster(3, 2);
  auto id = Submit(absl::StrReplaceAll(absl::StrCat(kJob, "replication: 2\n"),
                                       {{"num_servers: 2", "num_servers: 3"}}));
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  // Two of its three servers go at once: some shard had its primary and its backup on them.
  for (int i = 0; i < 2; ++i) {
    Leave(job.servers(i));
  }
  sched_->RunOnce();
  job = Get(*id);
  EXPECT_EQ(job.recovery().promotions(), 0u);
  EXPECT_EQ(job.recovery().recoveries(), 1u);
}

TEST_F(SchedulerTest, AServerThatComesBackAfterItsJobMovedAwayDropsItsCopy) {
  AddCluster(3, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &id));
  v1::Job job = Get(id);
  const std::string away = job.servers(0);
  size_t index = 0;
  while (ids_[index] != away) ++index;
  // It stops answering (paused): its lease lapses and the job moves to the spare server.
  AdvanceWithout(away, absl::Seconds(6));
  AdvanceWithout(away, absl::Seconds(6));
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  ASSERT_THAT(job.servers(), ::testing::Not(::testing::Contains(away)));
  EXPECT_THAT(Node(away)->server()->dropped(), IsEmpty());  // It was not reachable then.
  std::map<std::string, size_t> drops;
  for (const std::string& s : job.servers()) drops[s] = Node(s)->server()->dropped().size();

  // The same process comes back and registers again: the copy it may hold is dropped, and
  // nothing is dropped where the job runs now.
  v1::RegisterNodeRequest req;
  req.mutable_node()->set_role(v1::ROLE_SERVER);
  req.mutable_node()->set_address(Node(away)->address());
  req.mutable_node()->set_pid(1000 + index);
  v1::RegisterNodeResponse resp;
  ASSERT_THAT(sched_->RegisterNode(req, &resp), IsOk());
  ASSERT_EQ(resp.node_id(), away);
  sched_->RunOnce();
  EXPECT_THAT(Node(away)->server()->dropped(), ElementsAre(id));
  for (const std::string& s : job.servers()) {
    EXPECT_EQ(Node(s)->server()->dropped().size(), drops[s]) << s;
  }
  EXPECT_EQ(Get(id).state(), v1::JOB_RUNNING);
}

// A rank whose task is gone without a word (here: the scheduler died between recording a
// hand-over and sending the task) is found after the scheduler's restart and handed over.
TEST_F(SchedulerTest, AfterARestartARankWhoseWorkerRunsNoTaskIsHandedOver) {
  options_.startup_grace = absl::Seconds(1);
  AddCluster(1, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrReplaceAll(kJob, {{"num_servers: 2", "num_servers: 1"}}), &id));
  v1::Job job = Get(id);
  Node(job.workers(1))->worker()->FinishTask();  // Its task ended, and nobody heard.
  Node(job.servers(0))->server()->SetClocks({12, 11});
  StartScheduler();
  BeatAll();
  sched_->RunOnce();  // Within the start-up grace: nodes may still be coming back.
  EXPECT_EQ(Get(id).recovery().handovers(), 0u);
  clock_.Advance(absl::Seconds(2));
  BeatAll();
  sched_->RunOnce();
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().handovers(), 1u);
  EXPECT_THAT(job.recovery().last_cause(),
              HasSubstr("runs no task (found after a scheduler restart)"));
  // The same worker (idle, alive) takes its rank back where the server has it; rank 0, still
  // running, is left alone.
  auto assigned = Node(job.workers(1))->worker()->assigned();
  ASSERT_THAT(assigned, SizeIs(2));
  EXPECT_EQ(assigned[1].rank(), 1u);
  EXPECT_EQ(assigned[1].start_step(), 11);
  EXPECT_THAT(Node(job.workers(0))->worker()->assigned(), SizeIs(1));
  EXPECT_THAT(Node(job.workers(0))->worker()->stopped(), IsEmpty());
}

TEST_F(SchedulerTest, WithoutCheckpointsARestartedWorkersJobStartsAgainFromTheStart) {
  AddCluster(1, 1);
  auto id = Submit(absl::StrReplaceAll(kJob, {{"num_workers: 2", "num_workers: 1"},
                                              {"num_servers: 2", "num_servers: 1"}}));
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  ASSERT_EQ(Get(*id).state(), v1::JOB_RUNNING);
  v1::RegisterNodeRequest req;
  req.mutable_node()->set_role(v1::ROLE_WORKER);
  req.mutable_node()->set_address(Node(ids_[1])->address());
  req.mutable_node()->set_pid(4242);  // A new process at the same address.
  v1::RegisterNodeResponse resp;
  ASSERT_THAT(sched_->RegisterNode(req, &resp), IsOk());
  EXPECT_EQ(resp.node_id(), ids_[1]);
  sched_->RunOnce();
  v1::Job job = Get(*id);
  EXPECT_THAT(job.recovery().last_cause(), HasSubstr("restarted"));
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().start_step(), 0);
  EXPECT_THAT(job.recovery().restore_from(), IsEmpty());
  // The failed hand-over's task had attempt 1; the rollback's tasks run 2.
  EXPECT_EQ(Node(ids_[1])->worker()->assigned().back().attempt(), 2u);
  EXPECT_EQ(Node(ids_[0])->server()->updates().back().restore_step(), 0);
  EXPECT_EQ(Node(ids_[0])->server()->updates().back().min_attempt(), 2u);
}

TEST_F(SchedulerTest, RecoveriesAreLimitedThenTheJobFails) {
  options_.max_recoveries = 1;
  StartScheduler();
  AddCluster(1, 2);
  auto id = Submit(absl::StrReplaceAll(kJob, {{"num_workers: 2", "num_workers: 1"},
                                              {"num_servers: 2", "num_servers: 1"}}));
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  Leave(Get(*id).workers(0));
  sched_->RunOnce();
  v1::Job job = Get(*id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  const std::string second = job.workers(0);
  Leave(second);
  job = Get(*id);
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("already recovered 1 time, the --max_recoveries limit"));
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat(second, " at ")));
}

TEST_F(SchedulerTest, ACancelledRecoveryStaysCancelled) {
  AddCluster(1, 1);
  auto id = Submit(absl::StrReplaceAll(kJob, {{"num_workers: 2", "num_workers: 1"},
                                              {"num_servers: 2", "num_servers: 1"}}));
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  Leave(ids_[0]);  // The server: no hand-over, a rollback.
  ASSERT_EQ(Get(*id).state(), v1::JOB_RECOVERING);
  v1::CancelJobRequest creq;
  creq.set_job_id(*id);
  v1::CancelJobResponse cresp;
  ASSERT_THAT(sched_->CancelJob(creq, &cresp), IsOk());
  EXPECT_EQ(cresp.state(), v1::JOB_CANCELLED);
  sched_->RunOnce();
  EXPECT_EQ(Get(*id).state(), v1::JOB_CANCELLED);
  EXPECT_EQ(Get(*id).recovery().recoveries(), 0u);
}

TEST_F(SchedulerTest, RefusedPlacementsAreRetriedThenFail) {
  AddCluster(2, 2);
  for (const std::string& id : ids_) {
    if (FakeNode* n = Node(id); n->server()) {
      n->server()->FailUpdates(grpc::Status(grpc::StatusCode::UNAVAILABLE, "disk full"));
    }
  }
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  for (int attempt = 1; attempt < options_.max_placement_attempts; ++attempt) {
    sched_->RunOnce();
    v1::Job job = Get(*id);
    ASSERT_EQ(job.state(), v1::JOB_QUEUED);
    EXPECT_THAT(job.reason(), HasSubstr("placement failed: server server-"));
    EXPECT_THAT(job.reason(), HasSubstr("disk full"));
    EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("attempt ", attempt, " of 5")));
    sched_->RunOnce();  // Backing off: no new attempt yet.
    EXPECT_THAT(Get(*id).reason(), HasSubstr(absl::StrCat("attempt ", attempt, " of 5")));
    clock_.Advance(options_.placement_backoff);
    BeatAll();
  }
  sched_->RunOnce();
  v1::Job job = Get(*id);
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("gave up after 5 attempts"));
  for (const std::string& w : ids_) {
    if (FakeNode* n = Node(w); n->worker()) {
      EXPECT_THAT(n->worker()->assigned(), IsEmpty());
    }
  }
}

TEST_F(SchedulerTest, ABusyWorkerRollsThePlacementBack) {
  AddCluster(2, 2);
  // A task the scheduler does not know about keeps worker 2 busy.
  FakeNode* busy = Node(ids_[3]);
  {
    GrpcClusterRpc direct(GrpcClusterRpcOptions{});
    v1::AssignTaskRequest t;
    t.set_job_id("elsewhere");
    ASSERT_THAT(direct.AssignTask(busy->address(), t), IsOk());
  }
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*id);
  EXPECT_EQ(job.state(), v1::JOB_QUEUED);
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("worker ", ids_[3], ": AssignTask to ")));
  EXPECT_THAT(job.reason(), HasSubstr("busy with job elsewhere"));
  for (int s = 0; s < 2; ++s) EXPECT_THAT(Node(ids_[s])->server()->dropped(), ElementsAre(*id));
  // The other worker got the task and then a StopTask.
  FakeWorker* other = Node(ids_[2])->worker();
  EXPECT_THAT(other->assigned(), SizeIs(1));
  EXPECT_THAT(other->stopped(), SizeIs(1));
}

TEST_F(SchedulerTest, WorkersStillStoppingAnEndedJobAreWaitedForNotFailed) {
  AddCluster(2, 2);
  auto first = Submit(kJob);
  auto second = Submit(kJob);
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(second, IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*first);
  // job-1 succeeds, but its workers have not yet left their tasks (their final reports just
  // came in).
  ASSERT_THAT(Report(*first, 0, 10, true), IsOk());
  ASSERT_THAT(Report(*first, 1, 10, true), IsOk());
  ASSERT_EQ(Get(*first).state(), v1::JOB_SUCCEEDED);
  for (int i = 0; i < 2 * options_.max_placement_attempts; ++i) {
    clock_.Advance(options_.placement_backoff);
    BeatAll();
    sched_->RunOnce();
    v1::Job queued = Get(*second);
    ASSERT_EQ(queued.state(), v1::JOB_QUEUED) << queued.reason();
    EXPECT_THAT(queued.reason(),
                HasSubstr(absl::StrCat("waiting for resources: workers ", job.workers(0), " (",
                                       *first, "), ", job.workers(1), " (", *first,
                                       ") still stopping the task of a job that ended")));
  }
  // Nothing was asked of anyone meanwhile.
  for (const std::string& s : job.servers()) {
    for (const auto& u : Node(s)->server()->updates()) EXPECT_NE(u.map().job_id(), *second);
  }
  for (const std::string& w : job.workers()) EXPECT_THAT(Node(w)->worker()->assigned(), SizeIs(1));
  // Once they are idle, job-2 runs there.
  FinishTasks(*first);
  clock_.Advance(absl::Seconds(1));
  sched_->RunOnce();
  v1::Job running = Get(*second);
  EXPECT_EQ(running.state(), v1::JOB_RUNNING) << running.reason();
  for (const std::string& w : job.workers()) EXPECT_THAT(Node(w)->worker()->assigned(), SizeIs(2));
}

TEST_F(SchedulerTest, WaitingForComesFromTheServersToo) {
  AddCluster(2, 2);
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*id);
  Node(job.servers(0))->server()->SetWaitingFor({0});
  ASSERT_THAT(Report(*id, 0, 5, false), IsOk());
  ASSERT_THAT(Report(*id, 1, 5, false), IsOk());
  clock_.Advance(options_.status_poll_interval);
  sched_->RunOnce();
  EXPECT_THAT(Get(*id).progress().waiting_for(), ElementsAre(0));
}

TEST_F(SchedulerTest, AFinishedJobWaitsForNoOne) {
  AddCluster(2, 2);
  auto id = Submit(kJob);
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*id);
  // The servers' last poll saw both ranks holding pulls back.
  Node(job.servers(0))->server()->SetWaitingFor({0, 1});
  ASSERT_THAT(Report(*id, 0, 5, false), IsOk());
  ASSERT_THAT(Report(*id, 1, 5, false), IsOk());
  clock_.Advance(options_.status_poll_interval);
  sched_->RunOnce();
  EXPECT_THAT(Get(*id).progress().waiting_for(), ElementsAre(0, 1));
  // Rank 1 is done: it is no longer waited for, though the servers said so last.
  ASSERT_THAT(Report(*id, 1, 10, true), IsOk());
  EXPECT_THAT(Get(*id).progress().waiting_for(), ElementsAre(0));
  ASSERT_THAT(Report(*id, 0, 10, true, "", "/tmp/m.safetensors"), IsOk());
  EXPECT_EQ(Get(*id).state(), v1::JOB_SUCCEEDED);
  EXPECT_THAT(Get(*id).progress().waiting_for(), IsEmpty());
  FinishTasks(*id);

  // A cancelled job, likewise, right away and after a restart.
  auto second = Submit(kJob);
  ASSERT_THAT(second, IsOk());
  sched_->RunOnce();
  job = Get(*second);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING);
  Node(job.servers(0))->server()->SetWaitingFor({1});
  ASSERT_THAT(Report(*second, 0, 5, false), IsOk());
  ASSERT_THAT(Report(*second, 1, 4, false), IsOk());
  clock_.Advance(options_.status_poll_interval);
  sched_->RunOnce();
  EXPECT_THAT(Get(*second).progress().waiting_for(), ElementsAre(1));
  v1::CancelJobRequest req;
  req.set_job_id(*second);
  v1::CancelJobResponse resp;
  ASSERT_THAT(sched_->CancelJob(req, &resp), IsOk());
  EXPECT_THAT(Get(*second).progress().waiting_for(), IsEmpty());
  StartScheduler();
  EXPECT_THAT(Get(*second).progress().waiting_for(), IsEmpty());
  EXPECT_THAT(Get(*id).progress().waiting_for(), IsEmpty());
}

TEST_F(SchedulerTest, RestoredNodesGetNoNewWorkUntilHeardFrom) {
  AddCluster(1, 1);
  StartScheduler();  // Restarted: the nodes are known but not yet heard from.
  auto id = Submit(absl::StrReplaceAll(kJob, {{"num_workers: 2", "num_workers: 1"},
                                              {"num_servers: 2", "num_servers: 1"}}));
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  EXPECT_EQ(Get(*id).state(), v1::JOB_QUEUED);
  EXPECT_THAT(Get(*id).reason(), HasSubstr("waiting for resources"));
  BeatAll();
  sched_->RunOnce();
  EXPECT_EQ(Get(*id).state(), v1::JOB_RUNNING);
}

TEST_F(SchedulerTest, RestartKeepsJobsWithoutLossOrDuplicates) {
  AddCluster(2, 2);
  auto running = Submit(kJob, "token-a");
  ASSERT_THAT(running, IsOk());
  sched_->RunOnce();
  auto queued = Submit(kJob, "token-b");
  ASSERT_THAT(queued, IsOk());
  ASSERT_THAT(Report(*running, 0, 6, false), IsOk());
  ASSERT_THAT(Report(*running, 1, 5, false), IsOk());
  clock_.Advance(options_.progress_persist_interval);
  sched_->RunOnce();  // Writes the progress.

  StartScheduler();  // Same database, new process.
  v1::Job job = Get(*running);
  EXPECT_EQ(job.state(), v1::JOB_RUNNING);
  EXPECT_EQ(job.progress().step(), 5);
  EXPECT_EQ(Get(*queued).state(), v1::JOB_QUEUED);
  // A retried submission is the same job, not a duplicate; new jobs get new ids.
  auto again = Submit(kJob, "token-a");
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(*again, *running);
  auto fresh = Submit(kJob);
  ASSERT_THAT(fresh, IsOk());
  EXPECT_EQ(*fresh, "job-3");
  // Nodes are known by id; the running job carries on to success.
  BeatAll();
  ASSERT_THAT(Report(*running, 0, 10, true), IsOk());
  ASSERT_THAT(Report(*running, 1, 10, true), IsOk());
  EXPECT_EQ(Get(*running).state(), v1::JOB_SUCCEEDED);
  FinishTasks(*running);
  sched_->RunOnce();
  EXPECT_EQ(Get(*queued).state(), v1::JOB_RUNNING);
  // Each worker was given exactly one task per job: nothing ran twice.
  v1::Job done = Get(*running);
  for (const std::string& w : done.workers()) {
    EXPECT_THAT(Node(w)->worker()->assigned(), SizeIs(2));  // job-1, then job-2.
  }
}

}  // namespace
}  // namespace pscluster::scheduler

namespace pscluster::scheduler {
namespace {

// A shard of server A's moves to B: the map that gives B a live copy (B first, asked to wait for
// A's snapshot; A asked to send it), then, once B's copy has caught up, the map that makes B the
// primary (A first). The workers are not touched.
class ShardMoveTest : public SchedulerTest {
 protected:
  // A running job; *from is a server holding *shard, *to the other server.
  void Start(std::string* id, uint32_t* shard, std::string* from, std::string* to,
             const std::string& yaml = kJob) {
    AddCluster(2, 2);
    auto submitted = Submit(yaml);
    ASSERT_THAT(submitted, IsOk());
    *id = *submitted;
    sched_->RunOnce();
    v1::Job job = Get(*id);
    ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
    const v1::ShardMap map = MapOf(*id);
    *shard = map.assignments(3).shard();
    *from = map.assignments(3).primary();
    *to = *from == job.servers(0) ? job.servers(1) : job.servers(0);
  }
  absl::Status Move(const std::string& id, uint32_t shard, const std::string& to,
                    v1::ShardMove* queued = nullptr) {
    v1::MoveShardRequest req;
    req.set_job_id(id);
    req.set_shard(shard);
    req.set_to(to);
    v1::MoveShardResponse resp;
    absl::Status s = sched_->MoveShard(req, &resp);
    if (queued != nullptr) *queued = resp.move();
    return s;
  }
};

TEST_F(ShardMoveTest, AShardMovesToAnotherServerWithTwoMapsAndNoTaskStops) {
  std::string id, from, to;
  uint32_t shard = 0;
  Start(&id, &shard, &from, &to);
  const v1::ShardMap before = MapOf(id);
  const v1::Job started = Get(id);
  const std::vector<std::string> workers(started.workers().begin(), started.workers().end());
  Node(to)->server()->SetCopyOf(from, true);
  v1::ShardMove queued;
  ASSERT_THAT(Move(id, shard, to, &queued), IsOk());
  EXPECT_EQ(queued.state(), v1::MOVE_QUEUED);
  EXPECT_EQ(queued.from(), from);
  EXPECT_EQ(queued.reason(), "requested by psctl");
  sched_->RunMoves();

  v1::Job job = Get(id);
  ASSERT_EQ(job.moves_size(), 1);
  const v1::ShardMove& m = job.moves(0);
  EXPECT_EQ(m.state(), v1::MOVE_DONE) << m.result();
  EXPECT_EQ(m.epoch(), before.epoch() + 2);
  EXPECT_THAT(m.result(), HasSubstr("copied in"));
  EXPECT_EQ(job.shard_moves(), 1u);
  EXPECT_EQ(job.state(), v1::JOB_RUNNING);
  const v1::ShardMap after = MapOf(id);
  EXPECT_EQ(after.epoch(), before.epoch() + 2);
  for (int i = 0; i < after.assignments_size(); ++i) {
    const v1::ShardAssignment& a = after.assignments(i);
    EXPECT_EQ(a.primary(), a.shard() == shard ? to : before.assignments(i).primary());
    EXPECT_THAT(a.backups(), IsEmpty());
  }
  // The target: a live copy of the primary's shard, then the map that hands it over.
  auto updates = Node(to)->server()->updates();
  ASSERT_EQ(updates.size(), 3u);
  const v1::UpdateShardMapRequest& copy = updates[updates.size() - 2];
  EXPECT_EQ(copy.map().epoch(), before.epoch() + 1);
  ASSERT_EQ(copy.copy_from_size(), 1);
  EXPECT_EQ(copy.copy_from(0).primary(), from);
  EXPECT_TRUE(copy.copy_from(0).live());
  EXPECT_FALSE(copy.seed_new_backups());
  EXPECT_THAT(copy.map().assignments(static_cast<int>(shard)).backups(), ElementsAre(to));
  EXPECT_EQ(updates.back().map().epoch(), before.epoch() + 2);
  // The primary: asked (once) to snapshot for its new backup, then to let the shard go.
  updates = Node(from)->server()->updates();
  ASSERT_EQ(updates.size(), 3u);
  EXPECT_TRUE(updates[updates.size() - 2].seed_new_backups());
  EXPECT_THAT(updates[updates.size() - 2].copy_from(), IsEmpty());
  EXPECT_EQ(updates.back().map().epoch(), before.epoch() + 2);
  // No task was stopped or assigned again.
  for (const std::string& w : workers) {
    EXPECT_THAT(Node(w)->worker()->stopped(), IsEmpty());
    EXPECT_THAT(Node(w)->worker()->assigned(), SizeIs(1));
  }
  EXPECT_THAT(sched_->RenderMetrics(), HasSubstr("pscluster_scheduler_shard_moves_total 1"));
}

TEST_F(ShardMoveTest, ACopyThatDoesNotCatchUpIsDroppedAndTheShardStays) {
  options_.move_copy_timeout = absl::Milliseconds(200);
  StartScheduler();
  std::string id, from, to;
  uint32_t shard = 0;
  Start(&id, &shard, &from, &to);
  const v1::ShardMap before = MapOf(id);
  Node(to)->server()->SetCopyOf(from, false);
  ASSERT_THAT(Move(id, shard, to), IsOk());
  sched_->RunMoves();
  v1::Job job = Get(id);
  ASSERT_EQ(job.moves_size(), 1);
  EXPECT_EQ(job.moves(0).state(), v1::MOVE_FAILED);
  EXPECT_THAT(job.moves(0).result(), HasSubstr(absl::StrCat("the copy on ", to,
                                                           " did not catch up within")));
  EXPECT_EQ(job.shard_moves(), 0u);
  EXPECT_EQ(job.state(), v1::JOB_RUNNING);
  // A map without the copy, the shard where it was.
  const v1::ShardMap after = MapOf(id);
  EXPECT_EQ(after.epoch(), before.epoch() + 2);
  EXPECT_EQ(after.assignments(static_cast<int>(shard)).primary(), from);
  EXPECT_THAT(after.assignments(static_cast<int>(shard)).backups(), IsEmpty());
  EXPECT_EQ(Node(to)->server()->updates().back().map().epoch(), after.epoch());
  EXPECT_THAT(sched_->RenderMetrics(),
              HasSubstr("pscluster_scheduler_shard_moves_failed_total 1"));
}

// A scheduler stopped while a copy catches up resumes the move at its next start, from the
// saved map (the servers kept the copy going): no second copy, the same move done.
TEST_F(ShardMoveTest, AMoveUnderWayWhenTheSchedulerStopsResumesAtItsNextStart) {
  std::string id, from, to;
  uint32_t shard = 0;
  Start(&id, &shard, &from, &to);
  const v1::ShardMap before = MapOf(id);
  Node(to)->server()->SetCopyOf(from, false);
  ASSERT_THAT(Move(id, shard, to), IsOk());
  std::thread mover([&] { sched_->RunMoves(); });
  for (int i = 0; i < 500 && Node(from)->server()->updates().back().map().epoch() !=
                                 before.epoch() + 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(Node(from)->server()->updates().back().map().epoch(), before.epoch() + 1);
  sched_->Stop();
  mover.join();
  EXPECT_EQ(Get(id).moves(0).state(), v1::MOVE_COPYING);
  StartScheduler();
  Node(to)->server()->SetCopyOf(from, true);
  sched_->RunMoves();
  v1::Job job = Get(id);
  ASSERT_EQ(job.moves_size(), 1);
  EXPECT_EQ(job.moves(0).state(), v1::MOVE_DONE) << job.moves(0).result();
  EXPECT_EQ(MapOf(id).epoch(), before.epoch() + 2);
  EXPECT_EQ(MapOf(id).assignments(static_cast<int>(shard)).primary(), to);
  // The copy's map went out once.
  int copies = 0;
  for (const auto& u : Node(to)->server()->updates()) copies += u.copy_from_size();
  EXPECT_EQ(copies, 1);
}

TEST_F(ShardMoveTest, MovesThatCannotBeDoneAreRefusedWithExactCodes) {
  std::string id, from, to;
  uint32_t shard = 0;
  Start(&id, &shard, &from, &to);
  EXPECT_THAT(Move("no-such-job", shard, to), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Move(id, 1000, to), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("shard: 1000 is out of range")));
  EXPECT_THAT(Move(id, shard, ""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Move(id, shard, "s-99"), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                HasSubstr("not one of job")));
  EXPECT_THAT(Move(id, shard, from), StatusIs(absl::StatusCode::kFailedPrecondition,
                                              HasSubstr("already holds shard")));
  ASSERT_THAT(Move(id, shard, to), IsOk());
  EXPECT_THAT(Move(id, shard + 1, to), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                HasSubstr("one move at a time")));
  // Jobs whose shards do not move live.
  auto replicated = Submit(absl::StrCat(kJob, "replication: 2\n"));
  ASSERT_THAT(replicated, IsOk());
  EXPECT_THAT(Move(*replicated, 0, to), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(Get(id).moves_size(), 1) << "refused moves change nothing";
}

TEST_F(ShardMoveTest, TheRebalancerMovesAHotShardOffAnOverloadedServer) {
  options_.rebalance_every = absl::Seconds(5);
  options_.rebalance.min_bytes_per_sec = 1000;
  StartScheduler();
  std::string id, from, to;
  uint32_t shard = 0;
  Start(&id, &shard, &from, &to);
  Node(to)->server()->SetCopyOf(from, true);
  sched_->RunMoves();  // The first look only starts the period.
  // `from` carries shard `shard` hot and two more of its shards lightly; `to` nothing.
  const v1::ShardMap map = MapOf(id);
  std::vector<std::pair<uint32_t, double>> loads = {{shard, 6e6}};
  for (const auto& a : map.assignments()) {
    if (a.primary() == from && a.shard() != shard && loads.size() < 3) {
      loads.push_back({a.shard(), 1e6});
    }
  }
  ASSERT_THAT(loads, SizeIs(3));
  v1::HeartbeatRequest hb;
  hb.set_node_id(from);
  for (auto [s, bytes] : loads) {
    v1::ShardLoad* l = hb.add_shard_loads();
    l->set_job_id(id);
    l->set_shard(s);
    l->mutable_load()->set_bytes_per_sec(bytes);
  }
  v1::HeartbeatResponse resp;
  ASSERT_THAT(sched_->Heartbeat(hb, &resp), IsOk());
  clock_.Advance(absl::Seconds(5));
  sched_->RunMoves();
  v1::Job job = Get(id);
  ASSERT_EQ(job.moves_size(), 1);
  EXPECT_EQ(job.moves(0).state(), v1::MOVE_DONE) << job.moves(0).result();
  EXPECT_EQ(job.moves(0).shard(), shard);
  EXPECT_EQ(job.moves(0).to(), to);
  EXPECT_THAT(job.moves(0).reason(), HasSubstr(absl::StrCat("rebalance: ", from, " carried")));
  EXPECT_EQ(MapOf(id).assignments(static_cast<int>(shard)).primary(), to);
}

}  // namespace
}  // namespace pscluster::scheduler
