// The step loop on a device-like backend without a GPU (the copying stand-in, its streams run
// as far apart as the events allow) against a FakeParamClient: with a prefetching consistency
// (ASP) every step after the first computes with parameters uploaded while the step before it
// computed, the model learns, and a pull that fails while a step computes is the run's error
// with the device left idle and usable; with BSP nothing is prefetched.
#include "worker/step_pipeline.h"

#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/graph_model.h"
#include "kernels/models/model_test_util.h"
#include "kernels/testing/copying_backend.h"
#include "server/client/testing/fake_param_client.h"
#include "worker/tables.h"

namespace pscluster::worker {
namespace {

using ::pscluster::testing::StatusIs;
using ::testing::HasSubstr;
using kernels::testing::CopyingBackend;
using Call = FakeParameterStore::Call;

constexpr int64_t kDim = 16, kBatch = 32, kExamples = 640;

// Examples labelled by the side of a fixed hyperplane they fall on: a linear model learns them.
class SeparableData final : public TrainSource {
 public:
  explicit SeparableData(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(kDim);
    for (float& v : w) v = normal(rng);
    x_.resize(kExamples * kDim);
    for (float& v : x_) v = normal(rng);
    for (int64_t i = 0; i < kExamples; ++i) {
      float dot = 0;
      for (int64_t j = 0; j < kDim; ++j) dot += w[j] * x_[i * kDim + j];
      labels_.push_back(dot > 0 ? 1 : 0);
    }
  }
  int64_t examples() const override { return kExamples; }
  int64_t batch() const override { return kBatch; }
  absl::StatusOr<kernels::Batch> BatchFor(int64_t n) override {
    const int64_t first = (n * kBatch) % kExamples;
    kernels::Batch b;
    b.num_examples = kBatch;
    b.dense = absl::MakeConstSpan(x_).subspan(first * kDim, kBatch * kDim);
    b.labels = absl::MakeConstSpan(labels_).subspan(first, kBatch);
    return b;
  }
  absl::StatusOr<std::string> Repartition(const data::PartitionSpec&) override {
    return absl::UnimplementedError("not in this test");
  }

 private:
  std::vector<float> x_;
  std::vector<int32_t> labels_;
};

class Sink final : public ProgressSink {
 public:
  bool Report(const v1::WorkerProgress&) override { return true; }
  absl::StatusOr<v1::ShardMap> RefreshShardMap() override {
    return absl::UnavailableError("no scheduler in this test");
  }
};

std::unique_ptr<kernels::Backend> Cpu() {
  kernels::BackendOptions options;
  options.cpu_threads = 1;
  auto b = kernels::CreateBackend("cpu", options);
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(*b);
}

// One task's step loop: the model on `backend`, a store of its own, 4 epochs of 20 steps.
struct Task {
  Task(kernels::Backend* backend, v1::ConsistencySpec::Mode mode) : data(7) {
    auto m = kernels::CreateModel(kernels::testing::Spec("mlp", kDim, 2, {8}, "relu"), backend);
    EXPECT_TRUE(m.ok()) << m.status();
    model = std::move(*m);
    v1::JobSpec spec;
    spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
    spec.mutable_optimizer()->set_learning_rate(0.2f);
    consistency.set_mode(mode);
    consistency.set_staleness(mode == v1::ConsistencySpec::SSP ? 1 : 0);
    auto tables = TableSpecsFor(*model, spec, schedule.total_steps);
    EXPECT_TRUE(tables.ok()) << tables.status();
    v1::ShardMap map;
    map.set_job_id("job-1");
    map.set_epoch(1);
    client = std::make_unique<FakeParamClient>(store, 0, map, *tables);
    EXPECT_TRUE(client->CreateTables(consistency, 1, 0, "").ok());
    reporter = std::make_unique<ProgressReporter>(0, schedule.total_steps,
                                                  schedule.steps_per_epoch, absl::Hours(1),
                                                  &sink, [](const TaskSnapshot&) {});
    reporter->SetPart(data.examples(), data.batch());
    hooks.cancelled = [] { return false; };
    hooks.take_partition = [] { return std::optional<data::PartitionSpec>(); };
    hooks.computed = [](int64_t) {};
    hooks.epoch_done = [this](int64_t, int64_t step) {
      reporter->Report(step, true);
      return absl::OkStatus();
    };
    hooks.grad_scale = [](int64_t) { return 1.0f; };
  }
  absl::Status Run(kernels::Backend* backend) {
    const bool prefetch = consistency.mode() != v1::ConsistencySpec::BSP;
    StepPipeline pipeline(model.get(), backend, client.get(), &data, reporter.get(), schedule,
                          prefetch, "job-1 rank 0", hooks);
    return pipeline.Run(0);
  }
  const kernels::ParamPrefetch& prefetch() const {
    return dynamic_cast<const kernels::GraphModel&>(*model).param_prefetch();
  }

  Schedule schedule{20, 80};
  SeparableData data;
  std::unique_ptr<kernels::Model> model;
  v1::ConsistencySpec consistency;
  std::shared_ptr<FakeParameterStore> store = std::make_shared<FakeParameterStore>();
  std::unique_ptr<FakeParamClient> client;
  Sink sink;
  std::unique_ptr<ProgressReporter> reporter;
  StepPipelineHooks hooks;
};

TEST(StepPipelineOverlapTest, PrefetchingStepsComputeWithParametersUploadedTheStepBefore) {
  for (auto schedule : {CopyingBackend::Schedule::kOpsFirst,
                        CopyingBackend::Schedule::kCopiesFirst}) {
    for (auto mode : {v1::ConsistencySpec::ASP, v1::ConsistencySpec::SSP}) {
      SCOPED_TRACE(absl::StrCat(schedule == CopyingBackend::Schedule::kOpsFirst ? "ops first"
                                                                                 : "copies first",
                                ", mode ", mode));
      CopyingBackend device(Cpu(), false, schedule);
      Task task(&device, mode);
      ASSERT_THAT(task.Run(&device), pscluster::testing::IsOk());
      EXPECT_EQ(task.store->pushes().size(), 80u);
      EXPECT_EQ(task.prefetch().prefetched(), 79);
      EXPECT_EQ(task.prefetch().taken(), 79);
      EXPECT_GT(device.async_to_host, 0);  // Gradients went back on the download stream.
      EXPECT_LT(task.reporter->progress().loss(), 0.35) << "did not learn";
      for (auto s : {kernels::Stream::kOps, kernels::Stream::kUpload, kernels::Stream::kDownload}) {
        EXPECT_EQ(device.queued(s), 0u) << kernels::StreamName(s);
      }
    }
  }
}

TEST(StepPipelineOverlapTest, WithBspOrOnTheCpuNothingIsPrefetched) {
  CopyingBackend device(Cpu(), false, CopyingBackend::Schedule::kCopiesFirst);
  Task bsp(&device, v1::ConsistencySpec::BSP);
  ASSERT_THAT(bsp.Run(&device), pscluster::testing::IsOk());
  EXPECT_EQ(bsp.prefetch().prefetched(), 0);
  EXPECT_LT(bsp.reporter->progress().loss(), 0.35);
  std::unique_ptr<kernels::Backend> cpu = Cpu();
  Task asp(cpu.get(), v1::ConsistencySpec::ASP);
  ASSERT_THAT(asp.Run(cpu.get()), pscluster::testing::IsOk());
  EXPECT_EQ(asp.prefetch().prefetched(), 0);
  EXPECT_LT(asp.reporter->progress().loss(), 0.35);
}

TEST(StepPipelineOverlapTest, APullThatFailsWhileAStepComputesIsTheRunsErrorAndTheDeviceIsLeftIdle) {
  CopyingBackend device(Cpu(), false, CopyingBackend::Schedule::kOpsFirst);
  Task task(&device, v1::ConsistencySpec::ASP);
  task.store->FailNext(Call::kPull, absl::UnavailableError("pull lost (test)"), 1, /*after=*/5);
  EXPECT_THAT(task.Run(&device),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("pull lost (test)")));
  for (auto s : {kernels::Stream::kOps, kernels::Stream::kUpload, kernels::Stream::kDownload}) {
    EXPECT_EQ(device.queued(s), 0u) << kernels::StreamName(s);
  }
  EXPECT_EQ(task.store->pushes().size(), 4u);  // Steps 0-3; step 4 waited for step 5's pull.
  // The model is usable again: no step is left in flight.
  kernels::StepResult r;
  EXPECT_THAT(task.model->FinishStep(&r), StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace pscluster::worker
