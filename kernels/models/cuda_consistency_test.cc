// The CUDA backend's models agree with the CPU backend's: same parameters and batches give the
// same losses, accuracy counts and gradients to float32 accuracy, across steps whose batch sizes
// change (so device buffers are reused and regrown). Tagged gpu; skips without a device.
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/model_test_util.h"
#include "kernels/testing/test_util.h"

namespace pscluster::kernels {
namespace {

using testing::OwnedBatch;
using testing::OwnedParams;
using testing::Spec;

TEST(CudaConsistencyTest, ModelsMatchTheCpuBackend) {
  auto cuda = CreateBackend("cuda", BackendOptions());
  if (!cuda.ok()) GTEST_SKIP() << cuda.status();
  auto cpu = CreateBackend("cpu", BackendOptions());
  ASSERT_TRUE(cpu.ok());
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", ", (*cuda)->name()));
  std::mt19937_64 rng(seed);
  const v1::ModelSpec specs[] = {
      Spec("softmax", 784, 10),
      Spec("mlp", 784, 10, {256, 128}, "relu"),
      Spec("mlp", 784, 10, {64}, "gelu"),
      Spec("cnn", 784, 10, {64}, "relu", 0, {8, 16}),
      Spec("sparse_linear", 0, 2),
      Spec("sparse_linear", 0, 2, {32}, "gelu", 16),
  };
  for (const v1::ModelSpec& spec : specs) {
    SCOPED_TRACE(spec.ShortDebugString());
    auto on_cuda = CreateModel(spec, cuda->get());
    auto on_cpu = CreateModel(spec, cpu->get());
    ASSERT_TRUE(on_cuda.ok() && on_cpu.ok());
    for (int64_t n : {64, 7, 300, 64}) {
      OwnedBatch batch = (*on_cpu)->input_kind() == InputKind::kDense
                             ? testing::RandomDenseBatch(rng, n, 784, 10)
                             : testing::RandomSparseBatch(rng, n, 5000, 40, 2);
      auto keys = (*on_cpu)->SparseKeys(batch.view());
      ASSERT_TRUE(keys.ok());
      OwnedParams a(**on_cpu, *keys, rng, 0.05f);
      OwnedParams b = a;
      StepResult ra, rb;
      ASSERT_TRUE((*on_cpu)->TrainStep(batch.view(), a.view(), a.grad_view(), &ra).ok());
      absl::Status s = (*on_cuda)->TrainStep(batch.view(), b.view(), b.grad_view(), &rb);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_NEAR(rb.loss, ra.loss, 1e-5 * (1 + ra.loss)) << "n=" << n;
      EXPECT_NEAR(rb.correct, ra.correct, 1) << "n=" << n;  // A near-tie may round either way.
      for (size_t i = 0; i < a.grads.size(); ++i) {
        double scale = 0;
        for (float g : a.grads[i]) scale = std::max(scale, std::fabs(double(g)));
        for (size_t j = 0; j < a.grads[i].size(); ++j) {
          ASSERT_NEAR(b.grads[i][j], a.grads[i][j], 1e-6 + 1e-4 * scale)
              << (*on_cpu)->params()[i].name << "[" << j << "] n=" << n;
        }
      }
      StepResult ea;
      ASSERT_TRUE((*on_cuda)->Evaluate(batch.view(), b.view(), &ea).ok());
      EXPECT_NEAR(ea.loss, ra.loss, 1e-5 * (1 + ra.loss));
    }
  }
}

// The graph models (LR, FM, wide & deep, DLRM, a softmax over a mean bag) the same way, over
// batches of dense features and categorical fields.
TEST(CudaConsistencyTest, GraphModelsMatchTheCpuBackend) {
  auto cuda = CreateBackend("cuda", BackendOptions());
  if (!cuda.ok()) GTEST_SKIP() << cuda.status();
  auto cpu = CreateBackend("cpu", BackendOptions());
  ASSERT_TRUE(cpu.ok());
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", ", (*cuda)->name()));
  std::mt19937_64 rng(seed);
  constexpr uint64_t kFieldSize = 1000;
  struct GraphCase {
    v1::ModelSpec spec;
    int dense, fields, classes;
  };
  const GraphCase cases[] = {
      {testing::LrGraph(5000), 0, 0, 2},
      {testing::BagSoftmaxGraph(5000, 4), 0, 0, 4},
      {testing::FmGraph(26, kFieldSize, 16), 0, 26, 2},
      {testing::WideDeepGraph(13, 26, kFieldSize, 8, "relu"), 13, 26, 2},
      {testing::DlrmGraph(13, 26, kFieldSize, 16, "relu"), 13, 26, 2},
  };
  for (const GraphCase& c : cases) {
    SCOPED_TRACE(c.spec.ShortDebugString());
    auto on_cuda = CreateModel(c.spec, cuda->get());
    auto on_cpu = CreateModel(c.spec, cpu->get());
    ASSERT_TRUE(on_cuda.ok() && on_cpu.ok());
    for (int64_t n : {64, 7, 300, 64}) {
      OwnedBatch batch =
          c.fields > 0 ? testing::RandomFieldBatch(rng, n, c.dense, c.fields, kFieldSize, 2)
                       : testing::RandomSparseBatch(rng, n, 5000, 40, c.classes);
      auto keys = (*on_cpu)->SparseKeys(batch.view());
      ASSERT_TRUE(keys.ok()) << keys.status();
      OwnedParams a(**on_cpu, *keys, rng, 0.05f);
      OwnedParams b = a;
      StepResult ra, rb;
      ASSERT_TRUE((*on_cpu)->TrainStep(batch.view(), a.view(), a.grad_view(), &ra).ok());
      absl::Status s = (*on_cuda)->TrainStep(batch.view(), b.view(), b.grad_view(), &rb);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_NEAR(rb.loss, ra.loss, 1e-5 * (1 + ra.loss)) << "n=" << n;
      EXPECT_NEAR(rb.correct, ra.correct, 1) << "n=" << n;
      for (size_t i = 0; i < a.grads.size(); ++i) {
        double scale = 0;
        for (float g : a.grads[i]) scale = std::max(scale, std::fabs(double(g)));
        for (size_t j = 0; j < a.grads[i].size(); ++j) {
          ASSERT_NEAR(b.grads[i][j], a.grads[i][j], 1e-6 + 1e-4 * scale)
              << (*on_cpu)->params()[i].name << "[" << j << "] n=" << n;
        }
      }
    }
  }
}

}  // namespace
}  // namespace pscluster::kernels
