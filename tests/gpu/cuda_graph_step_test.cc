// Device-only checks of the CUDA Graph path (BackendOptions::cuda_graphs, step_graphs.h), for
// the GPU bundle: ops recorded on the backend's stream and replayed read the device memory of
// the moment they run; recording refuses to grow the scratch and leaves the backend usable; and
// graph models trained with recorded and replayed steps give the plain CUDA path's and the CPU
// backend's losses and gradients. Tagged gpu; skips without a device. Written without a device
// to run it on: nothing here has run on a GPU yet.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/graph_model.h"
#include "kernels/models/model_test_util.h"
#include "kernels/testing/test_util.h"

namespace pscluster::kernels {
namespace {

using testing::DeviceArray;
using testing::OwnedBatch;
using testing::OwnedParams;

std::unique_ptr<Backend> Cuda(bool graphs) {
  BackendOptions options;
  options.cuda_graphs = graphs;
  auto b = CreateBackend("cuda", options);
  return b.ok() ? std::move(*b) : nullptr;
}

TEST(CudaGraphTest, RecordedOpsReplayOnTheDataOfTheMomentTheyRun) {
  std::unique_ptr<Backend> cuda = Cuda(true);
  if (cuda == nullptr) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(cuda->records_graphs());
  const int64_t rows = 64, cols = 48;
  std::mt19937_64 rng(testing::FreshSeed());
  std::vector<float> x = testing::RandomFloats(rng, rows * cols);
  std::vector<float> bias = testing::RandomFloats(rng, cols);
  DeviceArray<float> dx(cuda.get(), x), dbias(cuda.get(), bias), dy(cuda.get(), rows * cols);
  DeviceArray<float> dsum(cuda.get(), cols);
  ASSERT_TRUE(cuda->BeginCapture().ok());
  EXPECT_EQ(cuda->Synchronize().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(cuda->AddBias(rows, cols, dx.get(), dbias.get(), dy.get()).ok());
  ASSERT_TRUE(cuda->ActivationForward(Activation::kRelu, rows * cols, dy.get(), dy.get()).ok());
  ASSERT_TRUE(cuda->ColumnSum(rows, cols, dy.get(), false, dsum.get()).ok());
  auto graph = cuda->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    x = testing::RandomFloats(rng, rows * cols);  // New data under the same pointers.
    dx.Upload(x);
    dy.Poison();
    dsum.Poison();
    ASSERT_TRUE((*graph)->Launch().ok());
    ASSERT_TRUE(cuda->Synchronize().ok());
    const std::vector<float> y = dy.Download(), sum = dsum.Download();
    for (int64_t j = 0; j < cols; ++j) {
      double want = 0;
      for (int64_t i = 0; i < rows; ++i) {
        const float v = std::max(0.0f, x[i * cols + j] + bias[j]);
        ASSERT_EQ(y[i * cols + j], v) << i << "," << j;
        want += v;
      }
      EXPECT_NEAR(sum[j], want, 1e-5 * (1 + std::fabs(want))) << j;
    }
  }
}

TEST(CudaGraphTest, GrowingTheScratchWhileRecordingIsRefusedAndTheBackendStaysUsable) {
  std::unique_ptr<Backend> cuda = Cuda(true);
  if (cuda == nullptr) GTEST_SKIP() << "no CUDA device";
  // 1024 rows of 32 columns: ColumnSum sums row chunks into scratch, which a fresh backend has
  // not allocated yet.
  const int64_t rows = 1024, cols = 32;
  std::vector<float> x(rows * cols, 1.0f);
  DeviceArray<float> dx(cuda.get(), x), dsum(cuda.get(), cols);
  const uint64_t epoch = cuda->memory_epoch();
  ASSERT_TRUE(cuda->BeginCapture().ok());
  EXPECT_EQ(cuda->ColumnSum(rows, cols, dx.get(), false, dsum.get()).code(),
            absl::StatusCode::kFailedPrecondition);
  auto graph = cuda->EndCapture();  // Whatever it says, the capture is over.
  EXPECT_FALSE(cuda->capturing());
  EXPECT_EQ(cuda->memory_epoch(), epoch);
  ASSERT_TRUE(cuda->Synchronize().ok());
  ASSERT_TRUE(cuda->ColumnSum(rows, cols, dx.get(), false, dsum.get()).ok());
  ASSERT_TRUE(cuda->Synchronize().ok());
  EXPECT_NE(cuda->memory_epoch(), epoch);  // The scratch grew: older recordings are stale.
  EXPECT_EQ(dsum.Download(), std::vector<float>(cols, static_cast<float>(rows)));
}

// The same steps on the CPU, on CUDA op by op, and on CUDA with recorded steps (batch 128 is
// the launch-bound case; 7 and 300 change the shapes and regrow the buffers; each batch runs
// three times, the last with another loss scale, so that sparse models' shapes recur too).
TEST(CudaGraphTest, ReplayedStepsMatchThePlainCudaPathAndTheCpu) {
  std::unique_ptr<Backend> graphs = Cuda(true), plain = Cuda(false);
  if (graphs == nullptr || plain == nullptr) GTEST_SKIP() << "no CUDA device";
  auto cpu = CreateBackend("cpu", BackendOptions());
  ASSERT_TRUE(cpu.ok());
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", ", graphs->name()));
  std::mt19937_64 rng(seed);
  for (const testing::ModelCase& c : testing::DeviceModelCases({256, 128})) {
    SCOPED_TRACE(c.spec.ShortDebugString());
    auto on_cpu = CreateModel(c.spec, cpu->get());
    auto on_plain = CreateModel(c.spec, plain.get());
    auto on_graphs = CreateModel(c.spec, graphs.get());
    ASSERT_TRUE(on_cpu.ok() && on_plain.ok() && on_graphs.ok());
    for (int64_t n : {128, 128, 7, 128, 300, 128, 7}) {
      OwnedBatch batch = testing::BatchFor(c, rng, n);
      auto keys = (*on_cpu)->SparseKeys(batch.view());
      ASSERT_TRUE(keys.ok()) << keys.status();
      for (float scale : {1.0f, 1.0f, 0.5f}) {
        SCOPED_TRACE(absl::StrCat("n ", n, " scale ", scale));
        OwnedParams a(**on_cpu, *keys, rng, 0.05f);
        OwnedParams b = a, g = a;
        Gradients ga = a.grad_view(), gb = b.grad_view(), gg = g.grad_view();
        ga.scale = gb.scale = gg.scale = scale;
        StepResult ra, rb, rg;
        ASSERT_TRUE((*on_cpu)->TrainStep(batch.view(), a.view(), ga, &ra).ok());
        absl::Status s = (*on_plain)->TrainStep(batch.view(), b.view(), gb, &rb);
        ASSERT_TRUE(s.ok()) << s;
        s = (*on_graphs)->TrainStep(batch.view(), g.view(), gg, &rg);
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_NEAR(rg.loss, rb.loss, 1e-6 * (1 + rb.loss));
        EXPECT_NEAR(rg.loss, ra.loss, 1e-5 * (1 + ra.loss));
        EXPECT_NEAR(rg.correct, ra.correct, 1);  // A near-tie may round either way.
        for (size_t i = 0; i < a.grads.size(); ++i) {
          double big = 0;
          for (float v : a.grads[i]) big = std::max(big, std::fabs(double(v)));
          for (size_t j = 0; j < a.grads[i].size(); ++j) {
            ASSERT_NEAR(g.grads[i][j], b.grads[i][j], 1e-6 + 1e-5 * big)
                << (*on_cpu)->params()[i].name << "[" << j << "] against plain CUDA";
            ASSERT_NEAR(g.grads[i][j], a.grads[i][j], 1e-6 + 1e-4 * big)
                << (*on_cpu)->params()[i].name << "[" << j << "] against the CPU";
          }
        }
        StepResult ea, eg;
        ASSERT_TRUE((*on_cpu)->Evaluate(batch.view(), a.view(), &ea).ok());
        ASSERT_TRUE((*on_graphs)->Evaluate(batch.view(), g.view(), &eg).ok());
        EXPECT_NEAR(eg.loss, ea.loss, 1e-5 * (1 + ea.loss));
      }
    }
    const auto* model = dynamic_cast<const GraphModel*>(on_graphs->get());
    ASSERT_NE(model, nullptr);
    const StepGraphs& sg = model->step_graphs();
    EXPECT_TRUE(sg.failure().ok()) << "recording failed on the device: " << sg.failure();
    EXPECT_GT(sg.stats().captured, 0);
    EXPECT_GT(sg.stats().replayed, sg.stats().captured);
    std::printf("  %s: %lld steps plain, %lld recorded, %lld replayed\n", c.spec.kind().c_str(),
                static_cast<long long>(sg.stats().plain),
                static_cast<long long>(sg.stats().captured),
                static_cast<long long>(sg.stats().replayed));
  }
}

}  // namespace
}  // namespace pscluster::kernels
