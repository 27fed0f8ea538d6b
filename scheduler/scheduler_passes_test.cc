// The scheduler's passes without sockets: the Scheduler driven by RunOnce() on a FakeClock
// against FakeClusterRpc (testing/fake_cluster_rpc.h), a real SQLite store in the test's
// directory, and nodes registered by name only. Each test reads the calls the passes made, in
// order, and injects failures per node and per call. PassAloneTest makes a pass over a core of
// its own (passes.h), with no Scheduler at all.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/passes.h"
#include "scheduler/placement.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/scheduler.h"
#include "scheduler/store.h"
#include "scheduler/testing/fake_cluster_rpc.h"
#include "scheduler/testing/heartbeats.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::scheduler::testing::FakeClusterRpc;
using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAreArray;

constexpr char kJob[] = R"(name: passes
model: {kind: mlp, hidden: [8]}
dataset: {name: fashion_mnist}
optimizer: {kind: sgd, learning_rate: 0.1}
consistency: {mode: bsp}
num_servers: 2
num_workers: 2
epochs: 1
batch_size: 10
)";

class SchedulerPassesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string db = std::string(std::getenv("TEST_TMPDIR")) + "/" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                           ".db";
    std::remove(db.c_str());
    auto store = Store::Open(StoreOptions{db, false});
    ASSERT_THAT(store, IsOk());
    store_ = std::move(*store);
    ASSERT_NO_FATAL_FAILURE(Restart());
  }
  // A new scheduler over the same store (a restart), with `quotas`.
  void Restart(std::shared_ptr<const Quotas> quotas = nullptr) {
    sched_.reset();
    SchedulerOptions o;
    o.lease = absl::Seconds(10);
    o.startup_grace = absl::Seconds(1);
    o.quotas = std::move(quotas);
    auto s = Scheduler::Create(o, store_.get(), &clock_, &rpc_, &placement_);
    ASSERT_THAT(s, IsOk());
    sched_ = std::move(*s);
  }
  static std::shared_ptr<const Quotas> QuotasOf(const std::string& text) {
    auto q = Quotas::Parse(text, "quotas.txt");
    EXPECT_THAT(q, IsOk());
    return q.ok() ? std::make_shared<const Quotas>(std::move(*q)) : nullptr;
  }

  // Registers a node at a made-up address (never dialed); returns its id.
  std::string Add(v1::NodeRole role) {
    v1::RegisterNodeRequest req;
    req.mutable_node()->set_role(role);
    const std::string address = absl::StrCat("10.0.0.", ids_.size() + 1, ":7000");
    req.mutable_node()->set_address(address);
    req.mutable_node()->mutable_capacity()->set_cpu_slots(1);
    req.mutable_node()->mutable_capacity()->set_memory_bytes(uint64_t{1} << 30);
    req.mutable_node()->set_pid(1000 + ids_.size());
    v1::RegisterNodeResponse resp;
    EXPECT_THAT(sched_->RegisterNode(req, &resp), IsOk());
    ids_.push_back(resp.node_id());
    addresses_.push_back(address);
    return resp.node_id();
  }
  const std::string& AddressOf(const std::string& id) const {
    for (size_t i = 0; i < ids_.size(); ++i) {
      if (ids_[i] == id) return addresses_[i];
    }
    ADD_FAILURE() << "no node " << id;
    return addresses_.front();
  }
  std::vector<std::string> AddressesOf(const google::protobuf::RepeatedPtrField<std::string>& ids) {
    std::vector<std::string> out;
    for (const std::string& id : ids) out.push_back(AddressOf(id));
    return out;
  }
  void AddCluster(int servers, int workers) {
    for (int i = 0; i < servers; ++i) Add(v1::ROLE_SERVER);
    for (int i = 0; i < workers; ++i) Add(v1::ROLE_WORKER);
  }
  // Submits the job and runs one pass: it must then be running (fatal otherwise).
  void StartJob(std::string* id, v1::Job* job) {
    *id = Submit();
    sched_->RunOnce();
    *job = Get(*id);
    ASSERT_EQ(job->state(), v1::JOB_RUNNING) << job->reason();
  }
  // Advances the clock while every node but `silent` heartbeats, then runs one pass.
  void AdvanceWithout(const std::string& silent, absl::Duration by) {
    clock_.Advance(by);
    ASSERT_NO_FATAL_FAILURE(testing::HeartbeatAllBut(*sched_, ids_, silent));
    sched_->RunOnce();
  }
  std::string Submit() {
    auto id = SubmitAs("");
    EXPECT_THAT(id, IsOk());
    return id.ok() ? *id : "";
  }
  absl::StatusOr<std::string> SubmitAs(const std::string& owner) {
    v1::SubmitJobRequest req;
    req.set_yaml(kJob);
    req.set_source("job.yaml");
    v1::SubmitJobResponse resp;
    absl::Status s = sched_->SubmitJob(req, &resp, owner);
    if (!s.ok()) return s;
    return resp.job_id();
  }
  v1::Job Get(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    EXPECT_THAT(sched_->GetJob(req, &job), IsOk());
    return job;
  }
  // Position of the first / last call of `method` in the call log (-1: none).
  int First(const std::string& method) const {
    auto calls = rpc_.calls();
    for (size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].method == method) return static_cast<int>(i);
    }
    return -1;
  }
  int Last(const std::string& method) const {
    auto calls = rpc_.calls();
    for (size_t i = calls.size(); i-- > 0;) {
      if (calls[i].method == method) return static_cast<int>(i);
    }
    return -1;
  }

  FakeClock clock_;
  FakeClusterRpc rpc_;
  CapacityPlacement placement_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Scheduler> sched_;
  std::vector<std::string> ids_, addresses_;
};

// Placement: every server holds the job's map before any worker is given a task, and each rank
// goes to one worker, attempt 0, from step 0.
TEST_F(SchedulerPassesTest, PlacementSendsTheMapToEveryServerBeforeAnyTask) {
  AddCluster(2, 2);
  std::string id;
  v1::Job job;
  ASSERT_NO_FATAL_FAILURE(StartJob(&id, &job));
  ASSERT_THAT(job.servers(), SizeIs(2));
  ASSERT_THAT(job.workers(), SizeIs(2));
  EXPECT_THAT(rpc_.CallsOf("UpdateShardMap"),
              UnorderedElementsAreArray(AddressesOf(job.servers())));
  for (const std::string& s : AddressesOf(job.servers())) EXPECT_TRUE(rpc_.Holds(s, id)) << s;
  ASSERT_GE(First("AssignTask"), 0);
  EXPECT_LT(Last("UpdateShardMap"), First("AssignTask"));
  for (int rank = 0; rank < 2; ++rank) {
    auto assigned = rpc_.assigned(AddressOf(job.workers(rank)));
    ASSERT_THAT(assigned, SizeIs(1));
    EXPECT_EQ(assigned[0].rank(), static_cast<uint32_t>(rank));
    EXPECT_EQ(assigned[0].attempt(), 0u);
    EXPECT_EQ(assigned[0].start_step(), 0);
    EXPECT_EQ(assigned[0].shard_map().epoch(), job.shard_map_epoch());
  }
}

// A server that refuses the map: no worker is given a task on a half-made placement, and the
// job is placed once the server answers again.
TEST_F(SchedulerPassesTest, AServerThatRefusesTheMapStartsNoTask) {
  const std::string s0 = Add(v1::ROLE_SERVER);
  Add(v1::ROLE_SERVER);
  Add(v1::ROLE_WORKER);
  Add(v1::ROLE_WORKER);
  rpc_.SetDown(AddressOf(s0), absl::UnavailableError("connection refused"));
  const std::string id = Submit();
  sched_->RunOnce();
  EXPECT_NE(Get(id).state(), v1::JOB_RUNNING);
  EXPECT_THAT(rpc_.CallsOf("AssignTask"), IsEmpty());
  rpc_.SetDown(AddressOf(s0), absl::OkStatus());
  for (int i = 0; i < 10 && Get(id).state() != v1::JOB_RUNNING; ++i) {
    AdvanceWithout("", absl::Seconds(3));
  }
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_THAT(rpc_.CallsOf("AssignTask"), SizeIs(2));
}

// A worker lost with its lease: every server fences the rank, and an idle worker resumes it at
// the slowest of the servers' clocks for that rank, one attempt later; no rollback.
TEST_F(SchedulerPassesTest, ALostWorkersRankResumesAtTheSlowestServerClock) {
  AddCluster(2, 3);
  std::string id;
  v1::Job job;
  ASSERT_NO_FATAL_FAILURE(StartJob(&id, &job));
  rpc_.SetClocks(AddressOf(job.servers(0)), id, {12, 9});
  rpc_.SetClocks(AddressOf(job.servers(1)), id, {12, 11});
  const std::string lost = job.workers(1);
  rpc_.SetDown(AddressOf(lost), absl::UnavailableError("no route to host"));
  for (int i = 0; i < 4; ++i) AdvanceWithout(lost, absl::Seconds(4));
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().handovers(), 1u);
  EXPECT_EQ(job.recovery().recoveries(), 0u);
  EXPECT_THAT(job.recovery().last_cause(), HasSubstr(lost));
  ASSERT_NE(job.workers(1), lost);
  for (const std::string& s : AddressesOf(job.servers())) {
    auto fences = rpc_.fences(s);
    ASSERT_THAT(fences, SizeIs(1)) << s;
    EXPECT_EQ(fences[0].worker(), 1u);
    EXPECT_EQ(fences[0].attempt(), 1u);
    EXPECT_TRUE(rpc_.Holds(s, id)) << s << " dropped the job";
  }
  auto assigned = rpc_.assigned(AddressOf(job.workers(1)));
  ASSERT_THAT(assigned, SizeIs(1));
  EXPECT_EQ(assigned[0].rank(), 1u);
  EXPECT_EQ(assigned[0].attempt(), 1u);
  EXPECT_EQ(assigned[0].start_step(), 9);
  EXPECT_THAT(rpc_.CallsOf("DropJob"), IsEmpty());
}

// A hand-over that cannot ask a server where the rank stands rolls the job back instead: its
// tasks are stopped and it is dropped on the servers that answer.
TEST_F(SchedulerPassesTest, AHandOverWithoutAServersClockRollsTheJobBack) {
  AddCluster(2, 3);
  std::string id;
  v1::Job job;
  ASSERT_NO_FATAL_FAILURE(StartJob(&id, &job));
  rpc_.SetClocks(AddressOf(job.servers(0)), id, {5, 5});
  // The other server has no clock to give (FAILED_PRECONDITION, as a server that lost it).
  const std::string kept = job.workers(0);
  const std::string lost = job.workers(1);
  rpc_.SetDown(AddressOf(lost), absl::UnavailableError("no route to host"));
  for (int i = 0; i < 4; ++i) AdvanceWithout(lost, absl::Seconds(4));
  job = Get(id);
  EXPECT_EQ(job.recovery().handovers(), 0u);
  EXPECT_EQ(job.recovery().recoveries(), 1u) << job.reason();
  EXPECT_THAT(rpc_.CallsOf("StopTask"), Contains(AddressOf(kept)));
  EXPECT_THAT(rpc_.CallsOf("FenceWorker"), SizeIs(2));
}

// Cancel: the tasks are stopped first; the job is dropped on its servers once its workers have
// stopped, and a server that the scheduler cannot reach then while it still heartbeats (a
// one-sided partition) is asked again, with backoff, until it answers: its tables do not stay.
TEST_F(SchedulerPassesTest, ACancelledJobIsDroppedOnEveryServerEvenOneThatWasAway) {
  AddCluster(2, 2);
  std::string id;
  v1::Job job;
  ASSERT_NO_FATAL_FAILURE(StartJob(&id, &job));
  const std::string away = AddressOf(job.servers(1));
  rpc_.SetDown(away, absl::UnavailableError("connection refused"));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  v1::CancelJobResponse cancelled;
  ASSERT_THAT(sched_->CancelJob(cancel, &cancelled), IsOk());
  for (int i = 0; i < 5; ++i) AdvanceWithout("", absl::Seconds(1));
  EXPECT_EQ(Get(id).state(), v1::JOB_CANCELLED);
  EXPECT_THAT(rpc_.CallsOf("StopTask"), SizeIs(2));
  for (const std::string& w : AddressesOf(job.workers())) EXPECT_FALSE(rpc_.Busy(w)) << w;
  ASSERT_GE(First("DropJob"), 0);
  EXPECT_LT(First("StopTask"), First("DropJob"));
  EXPECT_FALSE(rpc_.Holds(AddressOf(job.servers(0)), id));
  EXPECT_TRUE(rpc_.Holds(away, id));
  rpc_.SetDown(away, absl::OkStatus());
  for (int i = 0; i < 10 && rpc_.Holds(away, id); ++i) AdvanceWithout("", absl::Seconds(2));
  EXPECT_FALSE(rpc_.Holds(away, id)) << "the server that was away still holds the job";
}

// Quotas (--quota_file): an identity's unfinished jobs are counted, its own only, across a
// scheduler restart (the owner is stored with the job); a job that ends frees its place.
TEST_F(SchedulerPassesTest, AnIdentityPastItsJobQuotaIsRefusedNamingTheQuota) {
  AddCluster(2, 2);
  sched_->SetQuotas(QuotasOf("alice 1 -\n* 2 -\n"));
  auto first = SubmitAs("alice");
  ASSERT_THAT(first, IsOk());
  EXPECT_THAT(SubmitAs("alice"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr(absl::StrCat("quota: identity 'alice' may have at most 1 "
                                              "unfinished jobs (--quota_file quotas.txt:1); it "
                                              "has 1: ",
                                              *first))));
  // Others have their own count (the default line).
  ASSERT_THAT(SubmitAs("bob"), IsOk());
  ASSERT_THAT(SubmitAs("bob"), IsOk());
  EXPECT_THAT(SubmitAs("bob"), StatusIs(absl::StatusCode::kResourceExhausted,
                                        HasSubstr("quotas.txt:2); it has 2")));
  v1::ListJobsRequest list;
  v1::ListJobsResponse listed;
  ASSERT_THAT(sched_->ListJobs(list, &listed), IsOk());
  EXPECT_THAT(listed.jobs(), SizeIs(3)) << "a refused submission left a job";

  // After a restart the job still counts for alice.
  ASSERT_NO_FATAL_FAILURE(Restart(QuotasOf("alice 1 -\n")));
  EXPECT_THAT(SubmitAs("alice"), StatusIs(absl::StatusCode::kResourceExhausted,
                                          HasSubstr(*first)));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(*first);
  v1::CancelJobResponse cancelled;
  ASSERT_THAT(sched_->CancelJob(cancel, &cancelled), IsOk());
  EXPECT_THAT(SubmitAs("alice"), IsOk());
  // No quota file: no limit.
  sched_->SetQuotas(nullptr);
  EXPECT_THAT(SubmitAs("alice"), IsOk());
}

// A quota on server memory: the bytes the servers report for the identity's running jobs, as
// last polled; submissions are refused while they are at or over it.
TEST_F(SchedulerPassesTest, AnIdentityWhoseJobsHoldItsServerMemoryQuotaIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Restart(QuotasOf("* - 1MiB\n")));
  AddCluster(2, 2);
  auto id = SubmitAs("alice");
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  ASSERT_THAT(job.servers(), SizeIs(2));
  rpc_.SetTableBytes(AddressOf(job.servers(0)), *id, 700 << 10);
  rpc_.SetTableBytes(AddressOf(job.servers(1)), *id, 400 << 10);
  clock_.Advance(absl::Seconds(2));  // Past status_poll_interval since RunOnce's poll.
  sched_->RunOnce();
  EXPECT_THAT(SubmitAs("alice"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr(absl::StrCat("quota: identity 'alice' may hold at most 1 MiB of "
                                              "server memory (--quota_file quotas.txt:1); its "
                                              "running jobs hold 1126400 bytes on their servers (",
                                              *id, ")"))));
  EXPECT_THAT(SubmitAs("bob"), IsOk()) << "bob's jobs hold nothing yet";
  // The tables shrink (rows expired): alice may submit again once a poll has seen it.
  rpc_.SetTableBytes(AddressOf(job.servers(0)), *id, 100 << 10);
  clock_.Advance(absl::Seconds(2));
  sched_->RunOnce();
  EXPECT_THAT(SubmitAs("alice"), IsOk());
}

// The Scheduler keeps the order of its passes: every run of each is timed under its name, the
// control loop's in the order they run (their families render in the order they were added).
TEST_F(SchedulerPassesTest, EveryPassIsTimedUnderItsNameInItsOrder) {
  AddCluster(2, 2);
  std::string id;
  v1::Job job;
  ASSERT_NO_FATAL_FAILURE(StartJob(&id, &job));
  sched_->RunOnce();
  sched_->RunMoves();
  const std::string text = sched_->RenderMetrics();
  const std::vector<std::string> control = {
      "leases", "verify_tasks", "hand_over", "drop_unreachable_backups", "replace_backups",
      "recover", "place", "rejoin", "balance_data", "cleanups", "persist_progress"};
  size_t last = 0;
  for (const std::string& name : control) {
    const std::string line =
        absl::StrCat("pscluster_scheduler_pass_seconds_count{pass=\"", name, "\"} 2\n");
    size_t at = text.find(line);
    ASSERT_NE(at, std::string::npos) << line << " not in\n" << text;
    EXPECT_GT(at, last) << name << " is out of order";
    last = at;
  }
  EXPECT_THAT(text, HasSubstr("pscluster_scheduler_pass_seconds_count{pass=\"poll_servers\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("pscluster_scheduler_pass_seconds_count{pass=\"moves\"} 1\n"));
}

// A pass is an object over a SchedulerCore of its own: the cleanup pass, with no Scheduler, a
// real SQLite store, a FakeClock and a FakeClusterRpc. It stops the worker's task before it
// drops the job on the server whatever the order the cleanups were queued in, and a DropJob
// that fails is tried again after a second of the core's clock, not before.
TEST(PassAloneTest, CleanupPassRunsOverACoreOfItsOwn) {
  const std::string db = std::string(std::getenv("TEST_TMPDIR")) + "/pass_alone.db";
  std::remove(db.c_str());
  auto store = Store::Open(StoreOptions{db, false});
  ASSERT_THAT(store, IsOk());
  FakeClock clock;
  FakeClusterRpc rpc;
  CapacityPlacement placement;
  SchedulerOptions options;
  SchedulerCore core(options, store->get(), &clock, &rpc, &placement, /*view=*/false);
  ASSERT_THAT(core.Restore(), IsOk());
  std::vector<std::string> ids;
  for (const auto& [role, address] : {std::pair{v1::ROLE_SERVER, "10.0.0.1:7000"},
                                      std::pair{v1::ROLE_WORKER, "10.0.0.2:7000"}}) {
    v1::NodeInfo info;
    info.set_role(role);
    info.set_address(address);
    info.set_pid(4242);
    auto reg = core.registry().Register(info);
    ASSERT_THAT(reg, IsOk());
    ids.push_back(reg->node_id);
  }
  std::unique_ptr<Pass> cleanups = MakeCleanupPass(core);
  EXPECT_STREQ(cleanups->name(), "cleanups");
  {
    absl::MutexLock l(&core.mu());
    Cleanup drop;
    drop.drop_job = true;
    drop.node_id = ids[0];
    drop.job_id = "job-7";
    drop.reason = "cancelled";
    drop.not_before = absl::InfinitePast();
    Cleanup stop = drop;
    stop.drop_job = false;
    stop.node_id = ids[1];
    core.cleanups().push_back(drop);  // The drop first in the queue.
    core.cleanups().push_back(stop);
  }
  rpc.FailNext("10.0.0.1:7000", "DropJob", absl::UnavailableError("connection reset"));
  cleanups->Run();
  const std::vector<FakeClusterRpc::Call> calls = rpc.calls();
  std::vector<std::string> methods;
  for (const auto& c : calls) {
    if (c.method == "StopTask" || c.method == "DropJob") methods.push_back(c.method);
  }
  EXPECT_THAT(methods, ::testing::ElementsAre("StopTask", "DropJob"));
  // The failed DropJob waits a second of the core's clock.
  clock.Advance(absl::Milliseconds(900));
  cleanups->Run();
  EXPECT_THAT(rpc.CallsOf("DropJob"), SizeIs(1));
  clock.Advance(absl::Milliseconds(200));
  cleanups->Run();
  EXPECT_THAT(rpc.CallsOf("DropJob"), SizeIs(2));
  EXPECT_THAT(rpc.CallsOf("StopTask"), SizeIs(1));
  absl::MutexLock l(&core.mu());
  EXPECT_THAT(core.cleanups(), IsEmpty());
}

}  // namespace
}  // namespace pscluster::scheduler
