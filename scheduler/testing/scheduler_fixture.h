// SchedulerTest: the Scheduler handler driven directly with a FakeClock and RunOnce(), calling
// real gRPC stand-ins for servers and workers on loopback (fake_nodes.h); shared by the
// scheduler's test files (scheduler_test.cc, scheduler_handover_test.cc,
// scheduler_recovery_test.cc, shard_move_test.cc).
#ifndef PSCLUSTER_SCHEDULER_TESTING_SCHEDULER_FIXTURE_H_
#define PSCLUSTER_SCHEDULER_TESTING_SCHEDULER_FIXTURE_H_

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/atomic_file.h"
#include "common/checkpoint_file.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/grpc_cluster_rpc.h"
#include "scheduler/scheduler.h"
#include "scheduler/testing/failing_store.h"
#include "scheduler/testing/fake_nodes.h"
#include "scheduler/testing/heartbeats.h"

namespace pscluster::scheduler::testing {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

inline constexpr char kJob[] = R"(name: test-job
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
    ASSERT_NO_FATAL_FAILURE(testing::HeartbeatAllBut(*sched_, ids_, silent));
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


// A job with periodic checkpoints in `dir`: every 10 steps.
inline std::string CheckpointedJob(const std::string& dir, int servers = 2) {
  return absl::StrReplaceAll(kJob, {{"num_servers: 2", absl::StrCat("num_servers: ", servers,
                                                                    "\ncheckpoint_every_steps: 10"
                                                                    "\ncheckpoint_dir: ",
                                                                    dir)}});
}

// Writes what server `server` checkpoints of `job` at `step`: the shards it holds in `map`.
inline std::string WriteCheckpoint(const std::string& dir, const v1::ShardMap& map,
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

}  // namespace pscluster::scheduler::testing

#endif  // PSCLUSTER_SCHEDULER_TESTING_SCHEDULER_FIXTURE_H_
