// A worker's task against a FakeParamClient (no servers, no sockets): every step pushed once and
// in order, pulls at the right clocks, learning through the servers' update rules, the export
// written from what the store holds, and what the task does when a call fails, when it is
// cancelled while a pull waits, and when its shard map changes.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "server/client/testing/fake_param_client.h"
#include "worker/data/test_files.h"
#include "worker/streamed_data.h"
#include "worker/trainer.h"

namespace pscluster::worker {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::HasSubstr;
using Call = FakeParameterStore::Call;

class Sink final : public ProgressSink {
 public:
  bool Report(const v1::WorkerProgress& p) override {
    absl::MutexLock l(&mu_);
    last_ = p;
    return true;
  }
  absl::StatusOr<v1::ShardMap> RefreshShardMap() override {
    return absl::UnavailableError("no scheduler in this test");
  }
  v1::WorkerProgress last() {
    absl::MutexLock l(&mu_);
    return last_;
  }

 private:
  absl::Mutex mu_;
  v1::WorkerProgress last_ ABSL_GUARDED_BY(mu_);
};

// 60,000 Fashion-MNIST images in batches of 100: one rank, one epoch.
constexpr int64_t kSteps = 600;

class TrainerFakeClientTest : public ::testing::Test {
 protected:
  v1::AssignTaskRequest Task(v1::ConsistencySpec::Mode mode) {
    v1::AssignTaskRequest t;
    t.set_job_id("job-1");
    t.set_rank(0);
    t.set_num_workers(1);
    v1::JobSpec* spec = t.mutable_spec();
    spec->set_name("fake");
    spec->mutable_model()->set_kind("softmax");
    spec->mutable_dataset()->set_name("fashion_mnist");
    spec->mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
    spec->mutable_optimizer()->set_learning_rate(0.01f);
    spec->mutable_consistency()->set_mode(mode);
    spec->mutable_consistency()->set_staleness(mode == v1::ConsistencySpec::BSP ? 0 : 2);
    spec->set_num_servers(1);
    spec->set_num_workers(1);
    spec->set_epochs(1);
    spec->set_batch_size(100);
    spec->set_seed(5);
    t.mutable_shard_map()->set_job_id("job-1");
    t.mutable_shard_map()->set_epoch(1);
    return t;
  }

  TrainerOptions Options() {
    TrainerOptions o;
    o.device = "cpu";
    o.cpu_threads = 1;
    o.install_shard_map = true;
    o.report_interval = absl::Milliseconds(100);
    o.param_client_factory = [store = store_](const PsClientOptions& opts,
                                              const v1::ShardMap& map,
                                              const std::vector<v1::TableSpec>& tables)
        -> absl::StatusOr<std::unique_ptr<ParamClient>> {
      return std::make_unique<FakeParamClient>(store, opts.worker, map, tables);
    };
    return o;
  }

  std::unique_ptr<Trainer> Make(const v1::AssignTaskRequest& task) {
    auto t = Trainer::Create(task, Options(), &sink_);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }

  // The steps of the pushes the store applied, in order.
  std::vector<int64_t> PushedSteps() {
    std::vector<int64_t> steps;
    for (const auto& p : store_->pushes()) {
      EXPECT_EQ(p.worker, 0u);
      EXPECT_TRUE(p.end_of_step);
      steps.push_back(p.step);
    }
    return steps;
  }

  static std::vector<int64_t> Range(int64_t n) {
    std::vector<int64_t> r(n);
    for (int64_t i = 0; i < n; ++i) r[i] = i;
    return r;
  }

  std::shared_ptr<FakeParameterStore> store_ = std::make_shared<FakeParameterStore>();
  Sink sink_;
};

TEST_F(TrainerFakeClientTest, UnderBspEveryStepIsPushedOnceInOrderAndTheExportIsWhatTheStoreHolds) {
  const std::string export_path =
      std::string(std::getenv("TEST_TMPDIR")) + "/fake/softmax.safetensors";
  v1::AssignTaskRequest task = Task(v1::ConsistencySpec::BSP);
  task.mutable_spec()->set_export_path(export_path);
  auto trainer = Make(task);
  ASSERT_NE(trainer, nullptr);
  ASSERT_THAT(trainer->Run(), IsOk());

  EXPECT_EQ(trainer->result().steps, kSteps);
  EXPECT_EQ(PushedSteps(), Range(kSteps));
  EXPECT_EQ(store_->duplicate_pushes(), 0u);
  // The job's tables declared with its consistency and workers; the map installed (no
  // scheduler), once.
  EXPECT_TRUE(store_->created());
  EXPECT_EQ(store_->consistency().mode(), v1::ConsistencySpec::BSP);
  EXPECT_EQ(store_->num_workers(), 1u);
  EXPECT_EQ(store_->install_calls(), 1);
  // The pull of step 0, then each push of step n carried the pull of n + 1 (one round).
  std::vector<int64_t> clocks = store_->pull_clocks(0);
  ASSERT_GE(clocks.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(std::vector<int64_t>(clocks.begin(), clocks.begin() + kSteps), Range(kSteps));
  // The servers' update rule, through the store: softmax regression learns as against servers.
  EXPECT_GT(trainer->result().test_accuracy, 0.78) << trainer->result().test_accuracy;
  EXPECT_EQ(sink_.last().step(), kSteps);

  // The exported weights are the store's final values.
  auto file = SafetensorsFile::Read(export_path);
  ASSERT_TRUE(file.ok()) << file.status();
  for (const char* name : {"linear/weight", "linear/bias"}) {
    const SafetensorsFile::Entry* e = file->Find(name);
    ASSERT_NE(e, nullptr) << name;
    ASSERT_EQ(e->dtype, v1::DT_FLOAT32) << name;
    const std::vector<float> held = store_->Dense(name);
    ASSERT_FALSE(held.empty()) << name;
    absl::string_view bytes = file->Data(*e);
    ASSERT_EQ(bytes.size(), held.size() * sizeof(float)) << name;
    std::vector<float> exported(held.size());
    std::memcpy(exported.data(), bytes.data(), bytes.size());
    EXPECT_EQ(exported, held) << name;
  }
}

TEST_F(TrainerFakeClientTest, UnderAspThePrefetchingPipelineStillPushesEveryStepOnceInOrder) {
  auto trainer = Make(Task(v1::ConsistencySpec::ASP));
  ASSERT_NE(trainer, nullptr);
  ASSERT_THAT(trainer->Run(), IsOk());
  EXPECT_EQ(PushedSteps(), Range(kSteps));
  EXPECT_EQ(store_->consistency().mode(), v1::ConsistencySpec::ASP);
  // Prefetched pulls: one per step, at that step's clock, no fused round.
  std::vector<int64_t> clocks = store_->pull_clocks(0);
  ASSERT_GE(clocks.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(std::vector<int64_t>(clocks.begin(), clocks.begin() + kSteps), Range(kSteps));
  EXPECT_GT(trainer->result().test_accuracy, 0.76);
}

TEST_F(TrainerFakeClientTest, CudaGraphsAreRefusedForAJobThatAsksForTheCpu) {
  // The CPU backend launches nothing, so there is nothing to record: a job that chose the CPU
  // itself (device: cpu, or no GPUs) is told so rather than ignored.
  for (const char* device : {"cpu", ""}) {
    SCOPED_TRACE(device);
    v1::AssignTaskRequest task = Task(v1::ConsistencySpec::BSP);
    task.mutable_spec()->set_cuda_graphs(true);
    task.mutable_spec()->set_device(device);
    auto trainer = Make(task);
    ASSERT_NE(trainer, nullptr);
    EXPECT_THAT(trainer->Run(), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("spec.cuda_graphs: applies to CUDA")));
    EXPECT_TRUE(store_->pushes().empty());
  }
}

TEST_F(TrainerFakeClientTest, CudaGraphsHaveNoEffectWhereAnOpenDeviceChoiceFellToTheCpu) {
  // device: auto with a GPU asked for, on a worker whose backend is the CPU (Options(): --device
  // cpu): the job trains as it would without the option.
  v1::AssignTaskRequest task = Task(v1::ConsistencySpec::BSP);
  task.mutable_spec()->set_cuda_graphs(true);
  task.mutable_spec()->set_device("auto");
  task.mutable_spec()->set_gpus_per_worker(1);
  auto trainer = Make(task);
  ASSERT_NE(trainer, nullptr);
  ASSERT_THAT(trainer->Run(), IsOk());
  EXPECT_EQ(PushedSteps(), Range(kSteps));
  EXPECT_EQ(trainer->result().device.rfind("cpu", 0), 0u) << trainer->result().device;
}

TEST_F(TrainerFakeClientTest, AFencedTaskStopsAsCancelledWithTheReasonAndPushesNothingMore) {
  // Ten steps go through; the eleventh is refused as the servers refuse a fenced attempt
  // (ABORTED): the scheduler gave the rank to a newer task, so this one stops like a task told to
  // stop (CANCELLED, the reason kept), not as a failure of the job.
  store_->FailNext(Call::kPushPull,
                   absl::AbortedError("job 'job-1': attempt 0 of rank 0 was fenced"), 1, 10);
  auto trainer = Make(Task(v1::ConsistencySpec::BSP));
  ASSERT_NE(trainer, nullptr);
  EXPECT_THAT(trainer->Run(), StatusIs(absl::StatusCode::kCancelled, HasSubstr("fenced")));
  EXPECT_EQ(PushedSteps(), Range(10));
}

TEST_F(TrainerFakeClientTest, AnUnavailableStoreFailsTheTaskAtThatStep) {
  // PsClient retries UNAVAILABLE within its deadline; what outlasts it reaches the task.
  store_->FailNext(Call::kPush, absl::UnavailableError("server-1: connection refused"), 1, 5);
  auto trainer = Make(Task(v1::ConsistencySpec::ASP));
  ASSERT_NE(trainer, nullptr);
  EXPECT_THAT(trainer->Run(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("server-1")));
  EXPECT_EQ(PushedSteps(), Range(5));
}

TEST_F(TrainerFakeClientTest, CancelReleasesThePullTheTaskWaitsOn) {
  store_->HoldPulls();
  auto trainer = Make(Task(v1::ConsistencySpec::BSP));
  ASSERT_NE(trainer, nullptr);
  absl::Status ran;
  std::thread t([&] { ran = trainer->Run(); });
  ASSERT_TRUE(store_->WaitForHeldPulls(1, absl::Seconds(120)));
  trainer->Cancel("the job was cancelled");
  t.join();
  EXPECT_THAT(ran, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_TRUE(store_->pushes().empty());
}

TEST_F(TrainerFakeClientTest, ANewerShardMapReachesTheClientWhileAPullWaits) {
  store_->HoldPulls();
  v1::AssignTaskRequest task = Task(v1::ConsistencySpec::BSP);
  auto trainer = Make(task);
  ASSERT_NE(trainer, nullptr);
  absl::Status ran;
  std::thread t([&] { ran = trainer->Run(); });
  ASSERT_TRUE(store_->WaitForHeldPulls(1, absl::Seconds(120)));
  v1::ShardMap newer = task.shard_map();
  newer.set_epoch(7);
  trainer->UpdateShardMap(newer);
  EXPECT_EQ(trainer->Snapshot().shard_map_epoch, 7u);
  store_->ReleasePulls();
  t.join();
  EXPECT_THAT(ran, IsOk());
  EXPECT_EQ(PushedSteps(), Range(kSteps));
}

// A wide & deep layer graph on the user's Criteo files, exported at the end: each sparse table
// at exactly the keys the store holds rows for, with their rows, the dense tables whole; and the
// file alone is the model: evaluated from it, the test set scores what the task reported.
TEST_F(TrainerFakeClientTest, AGraphModelIsExportedAtTheKeysItTrainedAndScoresFromTheFileAlone) {
  const std::string dir = data::testing::NewTempDir("graph");
  data::testing::WriteText(dir + "/train.tsv", data::testing::PlantedCriteoLines(4000, 1));
  data::testing::WriteText(dir + "/test.tsv", data::testing::PlantedCriteoLines(500, 2));
  v1::AssignTaskRequest task = Task(v1::ConsistencySpec::BSP);
  v1::JobSpec* spec = task.mutable_spec();
  v1::ModelSpec* m = spec->mutable_model();
  m->Clear();
  m->set_kind("graph");
  auto layer = [&](const char* name, const char* type, std::vector<std::string> inputs) {
    v1::LayerSpec* l = m->add_layers();
    l->set_name(name);
    l->set_type(type);
    for (auto& i : inputs) l->add_inputs(i);
    return l;
  };
  layer("dense", "dense_input", {});
  layer("cat", "categorical_input", {});
  layer("wide", "linear", {"cat"});
  layer("emb", "embedding", {"cat"})->set_width(4);
  layer("deep_in", "concat", {"dense", "emb"});
  v1::LayerSpec* deep = layer("deep", "mlp", {"deep_in"});
  deep->add_widths(16);
  deep->add_widths(1);
  layer("logit", "add", {"wide", "deep"});
  layer("head", "sigmoid", {"logit"});
  v1::DatasetSpec* d = spec->mutable_dataset();
  d->Clear();
  d->set_format("criteo");
  d->set_train(dir + "/train.tsv");
  d->set_test(dir + "/test.tsv");
  d->set_hash_buckets(1000);
  d->set_dense_transform("log1p");
  spec->mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAGRAD);
  spec->mutable_optimizer()->set_learning_rate(0.1f);
  spec->set_batch_size(50);
  spec->set_epochs(4);
  const std::string export_path = dir + "/model.safetensors";
  spec->set_export_path(export_path);
  auto trainer = Make(task);
  ASSERT_NE(trainer, nullptr);
  ASSERT_THAT(trainer->Run(), IsOk());
  const double accuracy = trainer->result().test_accuracy;
  EXPECT_GT(accuracy, 0.95);

  // The model as the worker built it, to read the file by.
  auto data = OpenStreamedData(*spec);
  ASSERT_THAT(data, IsOk());
  const v1::ModelSpec model_spec =
      CompleteStreamedModelSpec(spec->model(), (*data)->dataset->schema());
  auto backend = kernels::CreateBackend("cpu", kernels::BackendOptions());
  ASSERT_THAT(backend, IsOk());
  auto model = kernels::CreateModel(model_spec, backend->get());
  ASSERT_THAT(model, IsOk());
  const std::vector<kernels::ParamInfo>& params = (*model)->params();
  auto file = SafetensorsFile::Read(export_path);
  ASSERT_THAT(file, IsOk());
  kernels::ParamValues values;
  std::vector<std::vector<float>> floats(params.size());
  std::vector<std::vector<uint64_t>> keys(params.size());
  int sparse = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const kernels::ParamInfo& p = params[i];
    const SafetensorsFile::Entry* e = file->Find(p.name);
    ASSERT_NE(e, nullptr) << p.name;
    floats[i].resize(file->Data(*e).size() / sizeof(float));
    std::memcpy(floats[i].data(), file->Data(*e).data(), floats[i].size() * sizeof(float));
    if (!p.sparse) {
      EXPECT_EQ(floats[i], store_->Dense(p.name)) << p.name;
    } else {
      ++sparse;
      const SafetensorsFile::Entry* k = file->Find(p.name + ".keys");
      ASSERT_NE(k, nullptr) << p.name;
      keys[i].resize(file->Data(*k).size() / sizeof(uint64_t));
      std::memcpy(keys[i].data(), file->Data(*k).data(), keys[i].size() * sizeof(uint64_t));
      EXPECT_EQ(keys[i].size(), store_->rows(p.name)) << p.name;
      EXPECT_FALSE(keys[i].empty()) << p.name;
      EXPECT_TRUE(std::is_sorted(keys[i].begin(), keys[i].end())) << p.name;
      ASSERT_EQ(floats[i].size(), keys[i].size() * p.row_width) << p.name;
      for (size_t r = 0; r < keys[i].size(); ++r) {
        auto held = store_->Row(p.name, keys[i][r]);
        ASSERT_TRUE(held.has_value()) << p.name << " key " << keys[i][r];
        ASSERT_EQ(*held, std::vector<float>(floats[i].begin() + r * p.row_width,
                                            floats[i].begin() + (r + 1) * p.row_width))
            << p.name << " key " << keys[i][r];
      }
    }
    values.values.push_back(floats[i]);
    values.keys.push_back(keys[i]);
  }
  EXPECT_EQ(sparse, 27);  // 26 fields' embeddings and the wide part.
  // Every key of the test lines was trained (ten values per field), so the file holds the model.
  StreamedTestSource test(data->get());
  ASSERT_THAT(test.Start(), IsOk());
  int64_t correct = 0, seen = 0;
  for (;;) {
    auto b = test.Next(100);
    ASSERT_THAT(b, IsOk());
    if (b->num_examples == 0) break;
    kernels::StepResult r;
    ASSERT_THAT((*model)->Evaluate(*b, values, &r), IsOk());
    correct += r.correct;
    seen += r.examples;
  }
  ASSERT_EQ(seen, 500);
  EXPECT_NEAR(static_cast<double>(correct) / seen, accuracy, 1e-9);
}

TEST_F(TrainerFakeClientTest, ATrainerWithoutAClientFactoryIsRefused) {
  TrainerOptions o = Options();
  o.param_client_factory = nullptr;
  EXPECT_THAT(Trainer::Create(Task(v1::ConsistencySpec::BSP), o, &sink_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("param_client_factory")));
}

}  // namespace
}  // namespace pscluster::worker
