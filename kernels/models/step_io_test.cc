// StepIO's copy paths, and Gradients::scale, without a GPU: a backend that runs the CPU
// backend's ops but keeps "device" memory apart from host memory (shares_host_memory() false),
// so every step goes through StepIO's staged and direct copies, which it counts.
#include "kernels/models/step_io.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
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

TEST(StepIOTest, SmallTensorsTravelTogetherAndLargeOnesDirectly) {
  CopyingBackend backend(Cpu());
  StepIO io(&backend);
  std::mt19937_64 rng(5);
  const size_t big = StepIO::kDirectBytes / sizeof(float) + 3;
  std::vector<float> in_small = testing::RandomFloats(rng, 10);
  std::vector<float> in_big = testing::RandomFloats(rng, big);
  std::vector<float> in_small2 = testing::RandomFloats(rng, 100);
  std::vector<float> out_small(7), out_big(big), out_big2(big + 1);
  for (int step = 0; step < 2; ++step) {  // The second step reuses the buffers.
    backend.to_device = backend.to_host = backend.syncs = 0;
    io.Begin();
    const int a = io.AddInput(in_small.data(), 4 * in_small.size());
    const int b = io.AddInput(in_big.data(), 4 * in_big.size());
    const int c = io.AddInput(in_small2.data(), 4 * in_small2.size());
    const int d = io.AddOutput(out_small.data(), 4 * out_small.size());
    const int e = io.AddOutput(out_big.data(), 4 * out_big.size());
    const int f = io.AddOutput(out_big2.data(), 4 * out_big2.size());
    ASSERT_TRUE(io.Upload().ok());
    EXPECT_EQ(backend.to_device, 2);  // The two small inputs in one copy, the large one alone.
    EXPECT_EQ(backend.syncs, 1);      // The large input was read from the caller's memory.
    auto dev = [&](int slot) { return static_cast<float*>(io.device(slot)); };
    for (int slot : {a, b, c, d, e, f}) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(io.device(slot)) % 256, 0u) << slot;
    }
    EXPECT_EQ(std::memcmp(dev(a), in_small.data(), 4 * in_small.size()), 0);
    EXPECT_EQ(std::memcmp(dev(b), in_big.data(), 4 * in_big.size()), 0);
    EXPECT_EQ(std::memcmp(dev(c), in_small2.data(), 4 * in_small2.size()), 0);
    // "Kernels" write the outputs on the device.
    for (size_t i = 0; i < out_small.size(); ++i) dev(d)[i] = step + 0.5f * i;
    for (size_t i = 0; i < big; ++i) dev(e)[i] = step - 1.0f * i;
    for (size_t i = 0; i <= big; ++i) dev(f)[i] = step + 2.0f * i;
    ASSERT_TRUE(io.Download().ok());
    EXPECT_EQ(backend.to_host, 3);  // The small output, and each large one.
    for (size_t i = 0; i < out_small.size(); ++i) ASSERT_EQ(out_small[i], step + 0.5f * i);
    for (size_t i = 0; i < big; ++i) ASSERT_EQ(out_big[i], step - 1.0f * i);
    for (size_t i = 0; i <= big; ++i) ASSERT_EQ(out_big2[i], step + 2.0f * i);
  }
}

TEST(StepIOTest, OnlySmallInputsNeedNoWaitInUpload) {
  CopyingBackend backend(Cpu());
  StepIO io(&backend);
  std::vector<float> x(16, 1.0f), y(4);
  io.Begin();
  io.AddInput(x.data(), 4 * x.size());
  io.AddOutput(y.data(), 4 * y.size());
  ASSERT_TRUE(io.Upload().ok());
  EXPECT_EQ(backend.syncs, 0);
  ASSERT_TRUE(io.Download().ok());
  EXPECT_EQ(backend.syncs, 1);
}

TEST(HostArrayTest, GrowsKeepingItsContents) {
  std::unique_ptr<Backend> cpu = Cpu();
  HostArray a;
  EXPECT_EQ(a.size(), 0u);
  ASSERT_TRUE(a.Resize(cpu.get(), 5).ok());
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  const float* before = a.data();
  ASSERT_TRUE(a.Resize(cpu.get(), 3).ok());  // Shrinking keeps the memory.
  EXPECT_EQ(a.data(), before);
  ASSERT_TRUE(a.Resize(cpu.get(), 1000).ok());
  EXPECT_EQ(a.size(), 1000u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a[i], static_cast<float>(i));
  EXPECT_EQ(a.end() - a.begin(), 1000);
}

// A model step through the copies gives the CPU backend's results, bit for bit; with
// Gradients::scale = 0.25 (a power of two, so no rounding differs) every gradient is a quarter.
TEST(StepIOTest, ModelStepsThroughCopiesMatchTheCpuAndScaleTheirGradients) {
  std::unique_ptr<Backend> cpu = Cpu();
  CopyingBackend copying(Cpu());
  std::mt19937_64 rng(testing::FreshSeed());
  for (const v1::ModelSpec& spec : {testing::Spec("mlp", 784, 10, {64}, "relu"),
                                    testing::Spec("sparse_linear", 0, 2, {16}, "relu", 8)}) {
    SCOPED_TRACE(spec.ShortDebugString());
    auto on_cpu = CreateModel(spec, cpu.get());
    auto through = CreateModel(spec, &copying);
    ASSERT_TRUE(on_cpu.ok() && through.ok());
    for (int64_t n : {32, 5, 32}) {
      testing::OwnedBatch batch = (*on_cpu)->input_kind() == InputKind::kDense
                                      ? testing::RandomDenseBatch(rng, n, 784, 10)
                                      : testing::RandomSparseBatch(rng, n, 3000, 20, 2);
      auto keys = (*on_cpu)->SparseKeys(batch.view());
      ASSERT_TRUE(keys.ok());
      testing::OwnedParams a(**on_cpu, *keys, rng, 0.05f);
      testing::OwnedParams b = a, c = a;
      StepResult ra, rb, rc;
      ASSERT_TRUE((*on_cpu)->TrainStep(batch.view(), a.view(), a.grad_view(), &ra).ok());
      ASSERT_TRUE((*through)->TrainStep(batch.view(), b.view(), b.grad_view(), &rb).ok());
      Gradients scaled = c.grad_view();
      scaled.scale = 0.25f;
      ASSERT_TRUE((*through)->TrainStep(batch.view(), c.view(), scaled, &rc).ok());
      EXPECT_EQ(rb.loss, ra.loss);
      EXPECT_EQ(rb.correct, ra.correct);
      EXPECT_EQ(rc.loss, ra.loss);
      for (size_t i = 0; i < a.grads.size(); ++i) {
        ASSERT_EQ(b.grads[i], a.grads[i]) << (*on_cpu)->params()[i].name;
        for (size_t j = 0; j < a.grads[i].size(); ++j) {
          ASSERT_EQ(c.grads[i][j], 0.25f * a.grads[i][j]) << (*on_cpu)->params()[i].name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace pscluster::kernels
