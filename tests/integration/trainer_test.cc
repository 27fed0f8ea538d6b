// Workers' training loop against real parameter servers started in this process (gRPC on
// loopback, port 0): two servers, one or two trainers on threads, no scheduler.
#include "worker/trainer.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"

#include "common/channel.h"
#include "common/clock.h"
#include "common/safetensors.h"
#include "proto/ps.grpc.pb.h"
#include "server/ps_server.h"
#include "worker/standalone.h"

namespace pscluster::worker {
namespace {

// Collects progress; never asks the task to stop unless told to.
class TestSink final : public ProgressSink {
 public:
  bool Report(const v1::WorkerProgress& p) override {
    absl::MutexLock l(&mu_);
    reports_.push_back(p);
    return !stop_;
  }
  absl::StatusOr<v1::ShardMap> RefreshShardMap() override {
    return absl::UnavailableError("no scheduler in this test");
  }
  void Stop() {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  std::vector<v1::WorkerProgress> reports() {
    absl::MutexLock l(&mu_);
    return reports_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::WorkerProgress> reports_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      auto s = PsServer::Start(PsServerOptions{}, &clock_);
      ASSERT_TRUE(s.ok()) << s.status();
      addresses_.push_back((*s)->address());
      servers_.push_back(std::move(*s));
    }
  }
  void TearDown() override {
    for (auto& s : servers_) s->Shutdown();
  }

  v1::AssignTaskRequest Task(const std::string& job, uint32_t rank, uint32_t workers) {
    v1::AssignTaskRequest t;
    t.set_job_id(job);
    t.set_rank(rank);
    t.set_num_workers(workers);
    v1::JobSpec* spec = t.mutable_spec();
    spec->set_name(job);
    spec->mutable_model()->set_kind("softmax");
    spec->mutable_dataset()->set_name("fashion_mnist");
    spec->mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
    spec->mutable_optimizer()->set_learning_rate(0.01f);
    spec->mutable_consistency()->set_mode(v1::ConsistencySpec::BSP);
    spec->set_num_servers(2);
    spec->set_num_workers(workers);
    spec->set_epochs(1);
    spec->set_batch_size(100);
    spec->set_seed(5);
    *t.mutable_shard_map() = *RoundRobinShardMap(job, addresses_, 16);
    return t;
  }

  // Creates one trainer per task and runs them all to the end at once (as the workers of one job).
  void RunAll(std::vector<v1::AssignTaskRequest> tasks, TestSink* sinks,
              std::vector<std::unique_ptr<Trainer>>* trainers) {
    for (size_t r = 0; r < tasks.size(); ++r) {
      auto t = Trainer::Create(tasks[r], Options(), &sinks[r]);
      ASSERT_TRUE(t.ok()) << t.status();
      trainers->push_back(std::move(*t));
    }
    std::vector<absl::Status> st(tasks.size());
    std::vector<std::thread> others;
    for (size_t r = 1; r < tasks.size(); ++r) {
      others.emplace_back([&, r] { st[r] = (*trainers)[r]->Run(); });
    }
    st[0] = (*trainers)[0]->Run();
    for (auto& t : others) t.join();
    for (size_t r = 0; r < tasks.size(); ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  }

  TrainerOptions Options() {
    TrainerOptions o;
    o.device = "cpu";
    o.cpu_threads = 1;
    o.install_shard_map = true;
    o.report_interval = absl::Milliseconds(100);
    o.call_timeout = absl::Seconds(30);
    o.call_latency = latency_;
    return o;
  }

  // Every trainer's calls, as a worker daemon's /metrics counts them.
  MetricsRegistry metrics_;
  std::shared_ptr<CallLatency> latency_ = [this] {
    auto l = std::make_shared<CallLatency>();
    l->pull = metrics_.AddHistogram("call_seconds", "", "call=\"pull\"");
    l->push = metrics_.AddHistogram("call_seconds", "", "call=\"push\"");
    l->push_pull = metrics_.AddHistogram("call_seconds", "", "call=\"push_pull\"");
    return l;
  }();

  RealClock clock_;
  std::vector<std::unique_ptr<PsServer>> servers_;
  std::vector<std::string> addresses_;
};

TEST_F(TrainerTest, TwoWorkersTrainSoftmaxUnderBspAndExport) {
  // The export directory does not exist yet: rank 0 creates it.
  std::string export_path =
      std::string(std::getenv("TEST_TMPDIR")) + "/models/new/softmax.safetensors";
  TestSink sinks[2];
  std::vector<std::unique_ptr<Trainer>> trainers;
  std::vector<v1::AssignTaskRequest> tasks;
  for (uint32_t r = 0; r < 2; ++r) {
    tasks.push_back(Task("job-bsp", r, 2));
    tasks.back().mutable_spec()->set_export_path(export_path);
  }
  ASSERT_NO_FATAL_FAILURE(RunAll(tasks, sinks, &trainers));

  TrainerResult r0 = trainers[0]->result();
  // 60,000 images / 2 workers / 100 per batch.
  EXPECT_EQ(r0.steps, 300);
  EXPECT_EQ(trainers[1]->result().steps, 300);
  // One epoch of softmax regression on Fashion-MNIST lands near the published 0.84.
  EXPECT_GT(r0.test_accuracy, 0.78) << r0.test_accuracy;
  EXPECT_LT(r0.test_loss, 0.8);
  EXPECT_EQ(trainers[1]->result().test_accuracy, -1);  // Only rank 0 evaluates.
  // Every step of both ranks made its pull and its push (or one push-pull round): each call's
  // duration was observed.
  const uint64_t calls =
      latency_->pull->count() + latency_->push->count() + latency_->push_pull->count();
  EXPECT_GE(calls, 2u * 300u);
  EXPECT_GE(latency_->pull->count() + latency_->push_pull->count(), 2u * 300u);
  EXPECT_GT(latency_->pull->sum() + latency_->push_pull->sum(), 0);

  // Progress was reported with the schedule's totals, and the final report says where the model
  // went.
  auto reports = sinks[0].reports();
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.back().step(), 300);
  EXPECT_EQ(reports.back().total_steps(), 300);
  EXPECT_EQ(reports.back().epoch(), 1u);
  EXPECT_EQ(reports.back().export_path(), export_path);
  EXPECT_GT(reports.back().samples_per_sec(), 0);

  auto file = SafetensorsFile::Read(export_path);
  ASSERT_TRUE(file.ok()) << file.status();
  const auto* w = file->Find("linear/weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<uint64_t>{784, 10}));
  ASSERT_NE(file->Find("linear/bias"), nullptr);
  EXPECT_EQ(file->metadata().at("job_id"), "job-bsp");
}

// Under SSP (s >= 1) and ASP the worker prefetches step n + 1's parameters while computing step n.
TEST_F(TrainerTest, SspAndAspWithPrefetchTrainToo) {
  for (auto mode : {v1::ConsistencySpec::SSP, v1::ConsistencySpec::ASP}) {
    TestSink sinks[2];
    std::vector<std::unique_ptr<Trainer>> trainers;
    std::string job = absl::StrCat("job-", v1::ConsistencySpec::Mode_Name(mode));
    std::vector<v1::AssignTaskRequest> tasks;
    for (uint32_t r = 0; r < 2; ++r) {
      tasks.push_back(Task(job, r, 2));
      tasks.back().mutable_spec()->mutable_consistency()->set_mode(mode);
      tasks.back().mutable_spec()->mutable_consistency()->set_staleness(2);
    }
    ASSERT_NO_FATAL_FAILURE(RunAll(tasks, sinks, &trainers));
    EXPECT_EQ(trainers[0]->result().steps, 300);
    // One epoch of softmax regression reaches about 0.795 either way. ASP has no staleness
    // bound: when the two workers share loaded cores unevenly one runs many steps ahead and the
    // same number of steps ends a little lower (0.77-0.78 seen), so its bar sits lower.
    EXPECT_GT(trainers[0]->result().test_accuracy,
              mode == v1::ConsistencySpec::ASP ? 0.76 : 0.78)
        << job;
  }
}

TEST_F(TrainerTest, CancelStopsPromptly) {
  TestSink sink;
  auto task = Task("job-cancel", 0, 1);
  task.mutable_spec()->set_epochs(50);
  auto t = Trainer::Create(task, Options(), &sink);
  ASSERT_TRUE(t.ok());
  absl::Status st;
  std::thread run([&] { st = (*t)->Run(); });
  // Cancelled mid-training: once steps are being made (loading the data set takes seconds on a
  // loaded machine).
  const absl::Time end = absl::Now() + absl::Seconds(60);
  while ((*t)->Snapshot().step < 5 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_GE((*t)->Snapshot().step, 5);
  (*t)->Cancel("test over");
  absl::Time cancelled = absl::Now();
  run.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_EQ(st.message(), "test over");
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(10));
  EXPECT_LT((*t)->Snapshot().step, 50 * 600) << "stopped before the end of its 50 epochs";
}

// A pull parked behind a worker that never comes (BSP, rank 1 absent) returns as soon as the task
// is cancelled, not at the call's deadline.
TEST_F(TrainerTest, CancelReleasesAPullWaitingForAnAbsentWorker) {
  TestSink sink;
  auto task = Task("job-parked", 0, 2);
  TrainerOptions opts = Options();
  opts.call_timeout = absl::Seconds(60);
  auto t = Trainer::Create(task, opts, &sink);
  ASSERT_TRUE(t.ok());
  absl::Status st;
  std::thread run([&] { st = (*t)->Run(); });
  // Rank 0 completes step 0, then its pull for step 1 waits for rank 1.
  absl::Time end = absl::Now() + absl::Seconds(20);
  while ((*t)->Snapshot().step < 1 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(20));
  absl::SleepFor(absl::Milliseconds(500));
  (*t)->Cancel("stopped by the test");
  absl::Time cancelled = absl::Now();
  run.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(5));
}

// Rank 0's worker never comes (lost, no idle worker to take it): the scheduler takes the rank
// out of the job on every server and hands its data to rank 1, which trains on alone, reads both
// parts, evaluates and exports (the lead rank now). Here the test makes those two calls.
TEST_F(TrainerTest, WhenTheOtherRankLeavesTheJobTheRemainingOneReadsItsDataAndLeads) {
  const std::string export_path =
      std::string(std::getenv("TEST_TMPDIR")) + "/left/softmax.safetensors";
  TestSink sink;
  auto task = Task("job-left", 1, 2);
  task.mutable_spec()->set_export_path(export_path);
  auto t = Trainer::Create(task, Options(), &sink);
  ASSERT_TRUE(t.ok()) << t.status();
  Trainer* trainer = t->get();
  // What cannot be done is refused and changes nothing.
  auto update = [](const v1::DataPartition& p, uint32_t lead, uint32_t training = 1) {
    v1::UpdatePartitionRequest u;
    *u.mutable_partition() = p;
    u.set_lead_rank(lead);
    u.set_training_ranks(training);
    return u;
  };
  v1::DataPartition bad;
  bad.set_index(0);
  bad.set_count(2);
  EXPECT_EQ(trainer->UpdatePartition(update(bad, 1)).code(), absl::StatusCode::kInvalidArgument);
  bad.set_index(1);
  bad.add_also(1);
  absl::Status own = trainer->UpdatePartition(update(bad, 1));
  EXPECT_EQ(own.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(own.message().find("partition.also[0]: part 1 is not another part"),
            std::string::npos)
      << own;
  v1::DataPartition both;
  both.set_index(1);
  both.set_count(2);
  both.add_also(0);
  EXPECT_EQ(trainer->UpdatePartition(update(both, 2)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(trainer->UpdatePartition(update(both, 1, 3)).code(),
            absl::StatusCode::kInvalidArgument);

  absl::Status st;
  std::thread run([&] { st = trainer->Run(); });
  // Rank 1 completes step 0; its pull for step 1 waits for rank 0, which never pushes.
  absl::Time end = absl::Now() + absl::Seconds(60);
  while (trainer->Snapshot().step < 1 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(20));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(trainer->Snapshot().step, 1) << "held back by the absent rank";
  for (const std::string& address : addresses_) {
    auto channel = MakeChannel(address);
    ASSERT_TRUE(channel.ok());
    auto stub = v1::ParameterServer::NewStub(*channel);
    v1::FenceWorkerRequest req;
    req.set_job_id("job-left");
    req.set_worker(0);
    req.set_leave(true);
    v1::FenceWorkerResponse resp;
    auto ctx = CallContext(absl::Seconds(10));
    grpc::Status gs = stub->FenceWorker(ctx.get(), req, &resp);
    ASSERT_TRUE(gs.ok()) << gs.error_message();
    EXPECT_EQ(resp.clock(), 0);
  }
  ASSERT_TRUE(trainer->UpdatePartition(update(both, 1)).ok());
  run.join();
  ASSERT_TRUE(st.ok()) << st;

  TrainerResult r = trainer->result();
  EXPECT_EQ(r.steps, 300) << "the job's schedule is unchanged";
  EXPECT_GT(r.test_accuracy, 0.75) << "rank 1 evaluates now";
  auto reports = sink.reports();
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.front().examples(), 30000u);
  EXPECT_EQ(reports.back().examples(), 60000u) << "it reads rank 0's part too";
  EXPECT_EQ(reports.back().export_path(), export_path);
  EXPECT_TRUE(SafetensorsFile::Read(export_path).ok());
}

// Data balancing: parts sized by shares, and each rank's batch the same share of the job's
// examples per step, so that both ranks still take the job's 300 steps per epoch.
TEST_F(TrainerTest, SharesSizeEachRanksPartAndBatch) {
  TestSink sinks[2];
  std::vector<std::unique_ptr<Trainer>> trainers;
  std::vector<v1::AssignTaskRequest> tasks;
  for (uint32_t r = 0; r < 2; ++r) {
    tasks.push_back(Task("job-shares", r, 2));
    tasks.back().mutable_partition()->set_index(r);
    tasks.back().mutable_partition()->set_count(2);
    for (uint32_t share : {1500u, 500u}) tasks.back().mutable_partition()->add_shares(share);
  }
  ASSERT_NO_FATAL_FAILURE(RunAll(tasks, sinks, &trainers));
  const uint32_t want_examples[2] = {45000, 15000}, want_batch[2] = {150, 50};
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(trainers[r]->result().steps, 300) << "rank " << r;
    auto reports = sinks[r].reports();
    ASSERT_FALSE(reports.empty());
    EXPECT_EQ(reports.back().examples(), want_examples[r]) << "rank " << r;
    EXPECT_EQ(reports.back().batch_size(), want_batch[r]) << "rank " << r;
    bool rated = false;
    for (const auto& p : reports) rated = rated || p.compute_rate() > 0;
    EXPECT_TRUE(rated) << "rank " << r << " reports its compute rate";
  }
  EXPECT_GT(trainers[0]->result().test_accuracy, 0.78);

  // New shares reach a task through UpdatePartition (taken before its next batch); a change of
  // its own part's index is refused, and so are bad shares.
  auto task = Task("job-shares-2", 1, 2);
  task.mutable_spec()->set_epochs(1);
  TestSink sink;
  auto t = Trainer::Create(task, Options(), &sink);
  ASSERT_TRUE(t.ok()) << t.status();
  v1::UpdatePartitionRequest u;
  u.mutable_partition()->set_index(1);
  u.mutable_partition()->set_count(2);
  u.mutable_partition()->add_shares(1);
  EXPECT_EQ((*t)->UpdatePartition(u).code(), absl::StatusCode::kInvalidArgument)
      << "one share for two parts";
  u.mutable_partition()->add_shares(3);
  ASSERT_TRUE((*t)->UpdatePartition(u).ok());
  u.mutable_partition()->set_index(0);
  EXPECT_EQ((*t)->UpdatePartition(u).code(), absl::StatusCode::kInvalidArgument);
}

// Shares that ask for more than a part holds per step (from a caller other than the scheduler,
// which keeps them within 4x of an equal part): the rank's batch is its whole part, no more.
TEST_F(TrainerTest, ARanksBatchIsNeverLargerThanItsPart) {
  TestSink sink;
  auto task = Task("job-huge-share", 0, 1000);
  task.mutable_spec()->set_batch_size(1000);
  task.mutable_partition()->set_index(0);
  task.mutable_partition()->set_count(1000);
  task.mutable_partition()->add_shares(1u << 20);
  for (int i = 1; i < 1000; ++i) task.mutable_partition()->add_shares(1);
  sink.Stop();  // The first report ends the task.
  auto t = Trainer::Create(task, Options(), &sink);
  ASSERT_TRUE(t.ok()) << t.status();
  (void)(*t)->Run();
  auto reports = sink.reports();
  ASSERT_FALSE(reports.empty());
  // 60,000 * 2^20 / (2^20 + 999) examples, where the shares alone would ask for 999,000.
  EXPECT_EQ(reports.front().examples(), 59942u);
  EXPECT_EQ(reports.front().batch_size(), 59942u);
}

// Aggregate steps weigh each rank's gradient by its batch: one step over the whole training set
// split 3:1 applies the same update as one split evenly (the mean gradient over all 60,000
// examples), up to float rounding.
TEST_F(TrainerTest, AggregateStepsWeighTheRanksByTheirBatches) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  auto run = [&](const std::string& job, std::vector<uint32_t> shares)
      -> absl::StatusOr<SafetensorsFile> {
    TestSink sinks[2];
    std::vector<std::unique_ptr<Trainer>> trainers;
    std::vector<v1::AssignTaskRequest> tasks;
    for (uint32_t r = 0; r < 2; ++r) {
      tasks.push_back(Task(job, r, 2));
      v1::JobSpec* spec = tasks.back().mutable_spec();
      spec->mutable_consistency()->set_aggregate(true);
      spec->set_batch_size(30000);  // One step per epoch: every example once.
      spec->mutable_optimizer()->set_learning_rate(0.5f);
      spec->set_eval_batch_size(10000);
      spec->set_export_path(absl::StrCat(dir, "/", job, ".safetensors"));
      tasks.back().mutable_partition()->set_index(r);
      tasks.back().mutable_partition()->set_count(2);
      for (uint32_t share : shares) tasks.back().mutable_partition()->add_shares(share);
    }
    RunAll(tasks, sinks, &trainers);
    if (::testing::Test::HasFatalFailure()) return absl::InternalError("run failed");
    if (trainers[0]->result().steps != 1) return absl::InternalError("not one step");
    return SafetensorsFile::Read(absl::StrCat(dir, "/", job, ".safetensors"));
  };
  auto even = run("job-agg-even", {});
  ASSERT_TRUE(even.ok()) << even.status();
  auto skewed = run("job-agg-skewed", {1500, 500});
  ASSERT_TRUE(skewed.ok()) << skewed.status();
  ASSERT_EQ(even->entries().size(), skewed->entries().size());
  double max_diff = 0, max_abs = 0;
  for (const auto& e : even->entries()) {
    const auto* o = skewed->Find(e.name);
    ASSERT_NE(o, nullptr) << e.name;
    absl::string_view a = even->Data(e), b = skewed->Data(*o);
    ASSERT_EQ(a.size(), b.size());
    const float* x = reinterpret_cast<const float*>(a.data());
    const float* y = reinterpret_cast<const float*>(b.data());
    for (size_t i = 0; i < a.size() / sizeof(float); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::abs(x[i] - y[i])));
      max_abs = std::max(max_abs, static_cast<double>(std::abs(x[i])));
    }
  }
  EXPECT_GT(max_abs, 1e-3) << "the step moved the weights";
  EXPECT_LT(max_diff, 1e-5 + 1e-4 * max_abs) << "largest weight " << max_abs;
}

TEST_F(TrainerTest, SinkCanStopTheTask) {
  TestSink sink;
  sink.Stop();
  auto task = Task("job-stop", 0, 1);
  task.mutable_spec()->set_epochs(50);
  auto t = Trainer::Create(task, Options(), &sink);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->Run().code(), absl::StatusCode::kCancelled);
}

TEST_F(TrainerTest, BadTasksAreRefusedWithTheFieldNamed) {
  TestSink sink;
  auto task = Task("job-bad", 0, 1);
  task.mutable_spec()->set_batch_size(0);
  auto t = Trainer::Create(task, Options(), &sink);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("batch_size"), std::string::npos);
  task.mutable_spec()->set_batch_size((1u << 20) + 1);
  t = Trainer::Create(task, Options(), &sink);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("spec.batch_size: 1048577 is not in"), std::string::npos);

  task = Task("job-bad", 0, 1);
  task.mutable_spec()->mutable_dataset()->set_path("/nonexistent/fashion");
  auto t2 = Trainer::Create(task, Options(), &sink);
  ASSERT_TRUE(t2.ok());
  absl::Status s = (*t2)->Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent/fashion"), std::string::npos) << s;

  task = Task("job-bad", 0, 1);
  task.mutable_spec()->mutable_model()->set_kind("transformer");
  auto t3 = Trainer::Create(task, Options(), &sink);
  ASSERT_TRUE(t3.ok());
  s = (*t3)->Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.kind"), std::string::npos) << s;

  // TF32 on a CPU backend would be ignored: the task refuses it instead.
  task = Task("job-bad", 0, 1);
  task.mutable_spec()->set_allow_tf32(true);
  auto tf32 = Trainer::Create(task, Options(), &sink);
  ASSERT_TRUE(tf32.ok());
  s = (*tf32)->Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("spec.allow_tf32: applies to CUDA"), std::string::npos) << s;

  // An export path that cannot be written fails the task before any training.
  task = Task("job-bad", 0, 1);
  task.mutable_spec()->set_export_path("/proc/no-such-dir/model.safetensors");
  auto t5 = Trainer::Create(task, Options(), &sink);
  ASSERT_TRUE(t5.ok());
  s = (*t5)->Run();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("export_path"), std::string::npos) << s;
  EXPECT_EQ((*t5)->Snapshot().step, 0);

  task = Task("job-bad", 0, 1);
  (*task.mutable_spec()->mutable_table_optimizers())["nope"].set_learning_rate(1);
  auto t4 = Trainer::Create(task, Options(), &sink);
  ASSERT_TRUE(t4.ok());
  s = (*t4)->Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("table_optimizers: 'nope'"), std::string::npos) << s;

  // Admission and expiry for a table the model does not have are refused, not ignored.
  task = Task("job-bad", 0, 1);
  (*task.mutable_spec()->mutable_table_embedding())["nope/*"].set_expire_after_steps(5);
  auto t6 = Trainer::Create(task, Options(), &sink);
  ASSERT_TRUE(t6.ok());
  s = (*t6)->Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("table_embedding: 'nope/*' names no parameter"), std::string::npos)
      << s;
}

}  // namespace
}  // namespace pscluster::worker
