// The Scheduler handler (testing/scheduler_fixture.h): placement, progress, cancellation, bad
// calls, checkpoints on demand, a failing store, and restarts.
#include "scheduler/testing/scheduler_fixture.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::scheduler::testing::FakeNode;
using ::pscluster::scheduler::testing::kJob;
using ::pscluster::scheduler::testing::SchedulerTest;
using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

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

// With --checkpoint_root, a job's checkpoint_dir and an on-demand checkpoint's directory must lie
// in it (the scheduler reads the job's checkpoints when it recovers): outside it, refused with
// PERMISSION_DENIED naming the root, and nothing is submitted or asked of the servers.
TEST_F(SchedulerTest, CheckpointDirectoriesOutsideTheCheckpointRootAreRefused) {
  const std::string root = std::string(std::getenv("TEST_TMPDIR")) + "/ckpt_root";
  ASSERT_THAT(MakeDirs(root + "/jobs"), IsOk());
  options_.checkpoint_root = root;
  StartScheduler();
  AddCluster(2, 2);
  for (const std::string& dir : {std::string("/etc/pscluster"), root + "/../elsewhere",
                                 std::string("relative/dir")}) {
    auto refused = Submit(absl::StrCat(kJob, "checkpoint_every_steps: 10\ncheckpoint_dir: ", dir,
                                       "\n"));
    EXPECT_FALSE(refused.ok()) << dir;
    EXPECT_THAT(refused.status().message(), HasSubstr("checkpoint_dir")) << dir;
  }
  auto outside = Submit(absl::StrCat(kJob, "checkpoint_every_steps: 10\ncheckpoint_dir: /tmp\n"));
  EXPECT_THAT(outside, StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr(root)));
  v1::ListJobsRequest list;
  v1::ListJobsResponse jobs;
  ASSERT_THAT(sched_->ListJobs(list, &jobs), IsOk());
  EXPECT_EQ(jobs.jobs_size(), 0) << "nothing submitted";

  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(
      absl::StrCat(kJob, "checkpoint_every_steps: 10\ncheckpoint_dir: ", root, "/jobs\n"), &id));
  v1::CheckpointJobRequest req;
  req.set_job_id(id);
  req.set_dir("/shared/ckpt");
  v1::CheckpointJobResponse resp;
  EXPECT_THAT(sched_->CheckpointJob(req, &resp),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr(root)));
  const v1::Job job = Get(id);
  for (const std::string& s : job.servers()) {
    EXPECT_THAT(Node(s)->server()->checkpoints(), IsEmpty()) << "no server was asked";
  }
  req.set_dir(root + "/jobs");
  EXPECT_THAT(sched_->CheckpointJob(req, &resp), IsOk());
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
