// The Scheduler's recovery passes (testing/scheduler_fixture.h): rank hand-overs and
// rollbacks onto spares, recoveries after restarts, and placements refused or waiting. The
// backups' passes (dropped, replaced, promoted) are in scheduler_backup_test.cc.
#include "scheduler/testing/scheduler_fixture.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::scheduler::testing::CheckpointedJob;
using ::pscluster::scheduler::testing::FakeNode;
using ::pscluster::scheduler::testing::FakeParameterServer;
using ::pscluster::scheduler::testing::FakeWorker;
using ::pscluster::scheduler::testing::kJob;
using ::pscluster::scheduler::testing::SchedulerTest;
using ::pscluster::scheduler::testing::WriteCheckpoint;
using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

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

}  // namespace
}  // namespace pscluster::scheduler
