// StepGraphs without a GPU, through the copying backend's recordings (which keep each op's
// arguments as a CUDA Graph does): when a key's steps are recorded and replayed, what is
// remembered and forgotten, the fallback when recording fails, the backend's rules while
// capturing, and graph models whose replayed steps give the plain steps' results bit for bit.
#include "kernels/models/step_graphs.h"

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/graph_model.h"
#include "kernels/models/model_test_util.h"
#include "kernels/testing/copying_backend.h"
#include "kernels/testing/test_util.h"

namespace pscluster::kernels {
namespace {

using testing::CopyingBackend;

std::unique_ptr<Backend> Cpu() {
  BackendOptions options;
  options.cpu_threads = 2;
  auto b = CreateBackend("cpu", options);
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(*b);
}

// A "step" of one op: x[0..n) = value, with the value read when the op is queued.
struct FillStep {
  Backend* backend;
  float* x;
  int64_t n = 4;
  float value = 1.0f;
  int queued = 0;  // Times the step's ops were queued (recorded or run).
  absl::Status operator()() {
    ++queued;
    return backend->Fill(n, value, x);
  }
};

class StepGraphsTest : public ::testing::Test {
 protected:
  StepGraphsTest() : backend_(Cpu(), /*records=*/true) {
    auto buffer = backend_.Allocate(64 * sizeof(float));
    EXPECT_TRUE(buffer.ok());
    buffer_ = std::move(*buffer);
  }
  float* x() { return buffer_.as<float>(); }
  void Clear() { std::memset(x(), 0, 64 * sizeof(float)); }

  CopyingBackend backend_;
  Buffer buffer_;
};

TEST_F(StepGraphsTest, AKeyRunsPlainlyFirstIsRecordedOnItsSecondStepAndReplayedAfter) {
  StepGraphs graphs(&backend_);
  FillStep step{&backend_, x()};
  for (int i = 0; i < 4; ++i) {
    Clear();
    ASSERT_TRUE(graphs.Run({7}, std::ref(step)).ok());
    EXPECT_EQ(x()[3], 1.0f) << "step " << i;  // The op ran every time.
    EXPECT_EQ(x()[4], 0.0f);
  }
  EXPECT_EQ(step.queued, 2);  // Plainly, then while recording; never again.
  EXPECT_EQ(graphs.stats().plain, 1);
  EXPECT_EQ(graphs.stats().captured, 1);
  EXPECT_EQ(graphs.stats().replayed, 3);
  EXPECT_EQ(backend_.recordings, 1);
  EXPECT_EQ(backend_.launches, 3);
  EXPECT_EQ(graphs.graphs(), 1u);
  EXPECT_TRUE(graphs.failure().ok());
}

TEST_F(StepGraphsTest, ARecordingKeepsTheArgumentsItWasRecordedWith) {
  // Why the key must cover every argument: a replay ignores what the caller would queue now.
  StepGraphs graphs(&backend_);
  FillStep step{&backend_, x()};
  ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());
  ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());  // Recorded with value 1.
  step.value = 2.0f;
  Clear();
  ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());
  EXPECT_EQ(x()[0], 1.0f);
  // Under its own key the new value is queued (plainly, then recorded).
  Clear();
  ASSERT_TRUE(graphs.Run({2}, std::ref(step)).ok());
  EXPECT_EQ(x()[0], 2.0f);
  step.n = 8;
  Clear();
  ASSERT_TRUE(graphs.Run({3}, std::ref(step)).ok());
  EXPECT_EQ(x()[7], 2.0f);
}

TEST_F(StepGraphsTest, ANewMemoryEpochStartsTheKeyAgain) {
  StepGraphs graphs(&backend_);
  FillStep step{&backend_, x()};
  ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());
  ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());
  EXPECT_EQ(graphs.stats().captured, 1);
  backend_.epoch = 1;  // The backend replaced its scratch: the recording may point at old memory.
  ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());
  EXPECT_EQ(graphs.stats().plain, 2);
  ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());
  EXPECT_EQ(graphs.stats().captured, 2);
  EXPECT_EQ(step.queued, 4);
}

TEST_F(StepGraphsTest, TheLeastRecentlyUsedKeyIsForgotten) {
  StepGraphs graphs(&backend_, /*max_keys=*/2);
  FillStep step{&backend_, x()};
  for (uint64_t k : {1, 1, 2, 1}) ASSERT_TRUE(graphs.Run({k}, std::ref(step)).ok());
  EXPECT_EQ(graphs.stats().replayed, 2);  // Key 1: recorded, then replayed.
  ASSERT_TRUE(graphs.Run({3}, std::ref(step)).ok());  // Key 2 was used least recently.
  EXPECT_EQ(graphs.stats().forgotten, 1);
  const int queued = step.queued;
  ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());
  EXPECT_EQ(step.queued, queued);  // Key 1's recording is still there.
  ASSERT_TRUE(graphs.Run({2}, std::ref(step)).ok());  // Key 2 starts over: plainly.
  EXPECT_EQ(step.queued, queued + 1);
  EXPECT_EQ(graphs.stats().forgotten, 2);
  EXPECT_LE(graphs.graphs(), 2u);
}

TEST_F(StepGraphsTest, AFailedRecordingRunsTheStepPlainlyAndRecordsNothingMore) {
  StepGraphs graphs(&backend_);
  FillStep step{&backend_, x()};
  backend_.fail_end_capture = true;
  ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());
  Clear();
  ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());  // The recording fails here.
  EXPECT_EQ(x()[0], 1.0f);                             // ... and the step ran anyway.
  EXPECT_EQ(step.queued, 3);
  EXPECT_EQ(graphs.failure().code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(graphs.enabled());
  EXPECT_FALSE(backend_.capturing());
  backend_.fail_end_capture = false;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());
  EXPECT_EQ(step.queued, 6);  // Plain from now on.
  EXPECT_EQ(backend_.recordings, 0);
  EXPECT_EQ(graphs.stats().captured, 0);
}

TEST_F(StepGraphsTest, AStepThatAllocatesWhileRecordedFallsBackToThePlainPath) {
  StepGraphs graphs(&backend_);
  int calls = 0;
  std::vector<Buffer> kept;
  auto step = [&]() -> absl::Status {
    ++calls;
    auto b = backend_.Allocate(256);  // Refused while capturing.
    if (!b.ok()) return b.status();
    kept.push_back(std::move(*b));
    return backend_.Fill(4, 3.0f, x());
  };
  ASSERT_TRUE(graphs.Run({1}, step).ok());
  ASSERT_TRUE(graphs.Run({1}, step).ok());
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(kept.size(), 2u);
  EXPECT_EQ(graphs.failure().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(x()[0], 3.0f);
}

TEST_F(StepGraphsTest, AStepThatFailsPlainlyTooReturnsItsErrorAndRecordingGoesOn) {
  StepGraphs graphs(&backend_);
  FillStep step{&backend_, nullptr};  // Fill of 4 floats into null: INVALID_ARGUMENT.
  EXPECT_EQ(graphs.Run({1}, std::ref(step)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(graphs.Run({1}, std::ref(step)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step.queued, 3);  // Plainly; recording (refused); plainly again.
  EXPECT_FALSE(backend_.capturing());
  EXPECT_TRUE(graphs.enabled());  // The step was at fault, not the recording.
  step.x = x();
  ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());
  EXPECT_EQ(graphs.stats().captured, 1);
}

TEST(StepGraphsPlainTest, ABackendThatDoesNotRecordRunsEveryStepPlainly) {
  CopyingBackend backend(Cpu(), /*records=*/false);
  StepGraphs graphs(&backend);
  EXPECT_FALSE(graphs.enabled());
  auto buffer = backend.Allocate(16);
  ASSERT_TRUE(buffer.ok());
  FillStep step{&backend, buffer->as<float>()};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(graphs.Run({1}, std::ref(step)).ok());
  EXPECT_EQ(step.queued, 3);
  EXPECT_EQ(backend.recordings, 0);
  EXPECT_EQ(graphs.stats().plain, 3);
}

TEST(BackendCaptureTest, WhileCapturingAllocationsHostCopiesAndWaitsAreRefused) {
  CopyingBackend backend(Cpu(), /*records=*/true);
  auto dev = backend.Allocate(64);
  ASSERT_TRUE(dev.ok());
  float host[16] = {};
  EXPECT_EQ(backend.EndCapture().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(backend.BeginCapture().ok());
  EXPECT_TRUE(backend.capturing());
  EXPECT_EQ(backend.BeginCapture().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backend.Allocate(64).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backend.AllocateHost(64).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backend.CopyToDevice(host, dev->data(), 64).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backend.CopyToHost(dev->data(), host, 64).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backend.Synchronize().code(), absl::StatusCode::kFailedPrecondition);
  // Copies within the device are recorded like any op.
  EXPECT_TRUE(backend.CopyOnDevice(dev->data(), dev->as<char>() + 32, 32).ok());
  auto graph = backend.EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_FALSE(backend.capturing());
  EXPECT_TRUE(backend.Allocate(64).ok());
}

TEST(BackendCaptureTest, TheCpuBackendRecordsNothingWhateverItsOptionsSay) {
  BackendOptions options;
  options.cuda_graphs = true;  // No effect on the CPU: there is nothing to launch.
  auto cpu = CreateBackend("cpu", options);
  ASSERT_TRUE(cpu.ok());
  EXPECT_FALSE((*cpu)->records_graphs());
  EXPECT_EQ((*cpu)->BeginCapture().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE((*cpu)->capturing());
}

// Graph models through a recording backend and through a plain one, step for step: recurring
// shapes are recorded and replayed, and every result (loss, correct count, each gradient, the
// scores) equals the plain path's bit for bit, also where only the loss's scale, the batch or
// the parameter values differ between steps with the same shapes.
TEST(StepGraphsModelTest, ReplayedStepsGiveThePlainStepsResultsBitForBit) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  constexpr uint64_t kFieldSize = 50;
  struct Case {
    v1::ModelSpec spec;
    int dense, fields, classes;
    bool replays;  // Whether shapes recur across batches (not with sparse keys: counts vary).
  };
  const Case cases[] = {
      {testing::Spec("mlp", 64, 10, {32, 16}, "relu"), 64, 0, 10, true},
      {testing::Spec("cnn", 64, 10, {16}, "relu", 0, {4, 8}), 64, 0, 10, true},
      {testing::WideDeepGraph(5, 6, kFieldSize, 4, "gelu"), 5, 6, 2, false},
      {testing::Spec("sparse_linear", 0, 2, {8}, "relu", 4), 0, 0, 2, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec.ShortDebugString());
    CopyingBackend plain_backend(Cpu(), /*records=*/false);
    CopyingBackend graph_backend(Cpu(), /*records=*/true);
    auto plain = CreateModel(c.spec, &plain_backend);
    auto graphed = CreateModel(c.spec, &graph_backend);
    ASSERT_TRUE(plain.ok() && graphed.ok()) << plain.status() << graphed.status();
    int step = 0;
    for (int64_t n : {16, 16, 5, 16, 5, 40, 16, 16}) {
      testing::OwnedBatch batch =
          c.fields > 0 ? testing::RandomFieldBatch(rng, n, c.dense, c.fields, kFieldSize, 2)
          : c.dense > 0 ? testing::RandomDenseBatch(rng, n, c.dense, c.classes)
                        : testing::RandomSparseBatch(rng, n, 300, 6, c.classes);
      auto keys = (*plain)->SparseKeys(batch.view());
      ASSERT_TRUE(keys.ok()) << keys.status();
      // The same batch (so the same shapes, sparse ones included) with new values, twice
      // with one scale and once with another.
      for (float scale : {1.0f, 1.0f, 0.5f}) {
        SCOPED_TRACE(absl::StrCat("step ", step++, " n ", n, " scale ", scale));
        testing::OwnedParams a(**plain, *keys, rng, 0.1f);
        testing::OwnedParams b = a;
        Gradients ga = a.grad_view(), gb = b.grad_view();
        ga.scale = gb.scale = scale;
        StepResult ra, rb;
        ASSERT_TRUE((*plain)->TrainStep(batch.view(), a.view(), ga, &ra).ok());
        absl::Status s = (*graphed)->TrainStep(batch.view(), b.view(), gb, &rb);
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_EQ(rb.loss, ra.loss);
        EXPECT_EQ(rb.correct, ra.correct);
        for (size_t i = 0; i < a.grads.size(); ++i) {
          ASSERT_EQ(b.grads[i], a.grads[i]) << (*plain)->params()[i].name;
        }
        StepResult ea, eb;
        std::vector<float> sa, sb;
        if ((*plain)->num_classes() == 2) {
          ASSERT_TRUE((*plain)->EvaluateScores(batch.view(), a.view(), &ea, &sa).ok());
          ASSERT_TRUE((*graphed)->EvaluateScores(batch.view(), b.view(), &eb, &sb).ok());
          EXPECT_EQ(sb, sa);
        } else {
          ASSERT_TRUE((*plain)->Evaluate(batch.view(), a.view(), &ea).ok());
          ASSERT_TRUE((*graphed)->Evaluate(batch.view(), b.view(), &eb).ok());
        }
        EXPECT_EQ(eb.loss, ea.loss);
        EXPECT_EQ(eb.correct, ea.correct);
      }
    }
    const auto* model = dynamic_cast<const GraphModel*>(graphed->get());
    ASSERT_NE(model, nullptr);
    const StepGraphs::Stats& stats = model->step_graphs().stats();
    EXPECT_TRUE(model->step_graphs().failure().ok()) << model->step_graphs().failure();
    EXPECT_GT(stats.captured, 0);
    EXPECT_GT(stats.replayed, stats.captured);
    EXPECT_EQ(graph_backend.launches, stats.replayed);
    if (c.replays) {
      // Dense models: training steps of 16 recur across batches; most steps replay.
      EXPECT_GT(stats.replayed, stats.plain);
    }
  }
}

// A backend whose recordings fail: the model logs it once, runs every step plainly and gives
// the plain results.
TEST(StepGraphsModelTest, AModelWhoseRecordingFailsRunsPlainly) {
  std::mt19937_64 rng(3);
  const v1::ModelSpec spec = testing::Spec("mlp", 32, 4, {8}, "relu");
  CopyingBackend plain_backend(Cpu(), /*records=*/false);
  CopyingBackend graph_backend(Cpu(), /*records=*/true);
  graph_backend.fail_end_capture = true;
  auto plain = CreateModel(spec, &plain_backend);
  auto graphed = CreateModel(spec, &graph_backend);
  ASSERT_TRUE(plain.ok() && graphed.ok());
  for (int i = 0; i < 4; ++i) {
    testing::OwnedBatch batch = testing::RandomDenseBatch(rng, 8, 32, 4);
    auto keys = (*plain)->SparseKeys(batch.view());
    ASSERT_TRUE(keys.ok());
    testing::OwnedParams a(**plain, *keys, rng, 0.1f);
    testing::OwnedParams b = a;
    StepResult ra, rb;
    ASSERT_TRUE((*plain)->TrainStep(batch.view(), a.view(), a.grad_view(), &ra).ok());
    ASSERT_TRUE((*graphed)->TrainStep(batch.view(), b.view(), b.grad_view(), &rb).ok());
    EXPECT_EQ(rb.loss, ra.loss);
    for (size_t j = 0; j < a.grads.size(); ++j) ASSERT_EQ(b.grads[j], a.grads[j]);
  }
  const auto* model = dynamic_cast<const GraphModel*>(graphed->get());
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->step_graphs().failure().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(model->step_graphs().stats().captured, 0);
  EXPECT_EQ(graph_backend.launches, 0);
}

}  // namespace
}  // namespace pscluster::kernels
