// The Scheduler's hand-over, leave, rejoin and data-balance passes (testing/scheduler_fixture.h).
#include "scheduler/testing/scheduler_fixture.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::scheduler::testing::kJob;
using ::pscluster::scheduler::testing::SchedulerTest;
using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// A worker cut off long enough for its rank to be handed over comes back still running the old
// task (fenced on the servers, but waiting out its calls): its heartbeat gets that task stopped.
// A task of a job that has ended is stopped the same way; the wanted task is left alone.
TEST_F(SchedulerTest, ATaskItsJobNoLongerGivesTheWorkerIsStoppedWhenItsWorkerIsHeardFrom) {
  AddCluster(2, 3);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &id));
  v1::Job job = Get(id);
  const std::string cut = job.workers(1);
  const std::string kept = job.workers(0);
  Node(job.servers(0))->server()->SetClocks({42, 41});
  Node(job.servers(1))->server()->SetClocks({41, 40});
  AdvanceWithout(cut, absl::Seconds(11));  // Its lease expires: rank 1 is handed over.
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  ASSERT_NE(job.workers(1), cut);
  ASSERT_EQ(job.recovery().handovers(), 1u);
  EXPECT_THAT(Node(cut)->worker()->stopped(), IsEmpty());

  // The cut-off worker comes back and reports its old task; the kept one reports its own.
  v1::RegisterNodeRequest again;
  again.mutable_node()->set_node_id(cut);
  again.mutable_node()->set_role(v1::ROLE_WORKER);
  again.mutable_node()->set_address(Node(cut)->address());
  again.mutable_node()->mutable_capacity()->set_cpu_slots(1);
  again.mutable_node()->mutable_capacity()->set_memory_bytes(uint64_t{1} << 30);
  v1::RegisterNodeResponse rr;
  ASSERT_THAT(sched_->RegisterNode(again, &rr), IsOk());
  for (const auto& [node, rank] : {std::pair<std::string, uint32_t>{cut, 1}, {kept, 0}}) {
    v1::HeartbeatRequest hb;
    hb.set_node_id(node);
    v1::WorkerTaskLoad* t = hb.add_tasks();
    t->set_job_id(id);
    t->set_rank(rank);
    v1::HeartbeatResponse r;
    ASSERT_THAT(sched_->Heartbeat(hb, &r), IsOk());
    ASSERT_THAT(sched_->Heartbeat(hb, &r), IsOk());  // Twice: one StopTask all the same.
  }
  sched_->RunOnce();
  auto stopped = Node(cut)->worker()->stopped();
  ASSERT_THAT(stopped, SizeIs(1));
  EXPECT_EQ(stopped[0].job_id(), id);
  EXPECT_THAT(stopped[0].reason(), HasSubstr("rank 1 of job " + id + " is no longer this worker's"));
  EXPECT_THAT(Node(kept)->worker()->stopped(), IsEmpty());
  EXPECT_EQ(Get(id).state(), v1::JOB_RUNNING);

  // A task of a job the scheduler has never heard of is stopped too.
  v1::HeartbeatRequest hb;
  hb.set_node_id(kept);
  hb.add_tasks()->set_job_id("job-from-elsewhere");
  v1::HeartbeatResponse r;
  ASSERT_THAT(sched_->Heartbeat(hb, &r), IsOk());
  sched_->RunOnce();
  stopped = Node(kept)->worker()->stopped();
  ASSERT_THAT(stopped, SizeIs(1));
  EXPECT_EQ(stopped[0].job_id(), "job-from-elsewhere");
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

}  // namespace
}  // namespace pscluster::scheduler
