// Device-only checks of a step's copies overlapping its computation (the CUDA backend's upload
// and download streams, ordered by events; kernels/models/param_prefetch.h and the per-layer
// gradient copies of GraphModel), for the GPU bundle: events order the copy streams against the
// op stream on large transfers, and models trained as a worker overlaps its steps (start step
// n, prefetch step n+1's parameters from page-locked or pageable memory, finish step n; with
// and without recorded steps) give the synchronous path's losses and gradients (gradients in
// one download after the ops, no prefetch) and the CPU's. Tagged gpu; skips without a device.
// Written without a device to run it on: nothing here has run on a GPU yet.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/graph_model.h"
#include "kernels/models/model_test_util.h"
#include "kernels/models/step_io.h"
#include "kernels/testing/test_util.h"

namespace pscluster::kernels {
namespace {

using testing::OwnedBatch;
using testing::OwnedParams;

std::unique_ptr<Backend> Cuda(bool graphs) {
  BackendOptions options;
  options.cuda_graphs = graphs;
  auto b = CreateBackend("cuda", options);
  return b.ok() ? std::move(*b) : nullptr;
}

// 64 MiB each way, in rounds with new data: long enough that a missing wait would show.
TEST(CudaStreamsTest, EventsOrderTheCopyStreamsAgainstTheOps) {
  std::unique_ptr<Backend> cuda = Cuda(false);
  if (cuda == nullptr) GTEST_SKIP() << "no CUDA device";
  const size_t n = size_t{16} << 20, bytes = n * sizeof(float);
  auto src = cuda->AllocateHost(bytes), dst = cuda->AllocateHost(bytes);
  auto a = cuda->Allocate(bytes), b = cuda->Allocate(bytes);
  auto uploaded = cuda->CreateEvent(), computed = cuda->CreateEvent(), back = cuda->CreateEvent();
  ASSERT_TRUE(src.ok() && dst.ok() && a.ok() && b.ok());
  ASSERT_TRUE(uploaded.ok() && computed.ok() && back.ok());
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    float* s = src->as<float>();
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<float>(round * 7 + i % 1000);
    ASSERT_TRUE(cuda->CopyToDeviceAsync(s, a->data(), bytes).ok());
    ASSERT_TRUE(cuda->RecordEvent(Stream::kUpload, *uploaded).ok());
    ASSERT_TRUE(cuda->WaitEvent(Stream::kOps, *uploaded).ok());
    ASSERT_TRUE(cuda->CopyOnDevice(a->data(), b->data(), bytes).ok());
    ASSERT_TRUE(cuda->ActivationForward(Activation::kRelu, static_cast<int64_t>(n),
                                        b->as<float>(), b->as<float>())
                    .ok());
    ASSERT_TRUE(cuda->RecordEvent(Stream::kOps, *computed).ok());
    ASSERT_TRUE(cuda->WaitEvent(Stream::kDownload, *computed).ok());
    ASSERT_TRUE(cuda->CopyToHostAsync(b->data(), dst->data(), bytes).ok());
    ASSERT_TRUE(cuda->RecordEvent(Stream::kDownload, *back).ok());
    ASSERT_TRUE(cuda->WaitForEvent(*back).ok());
    const float* d = dst->as<float>();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(d[i], s[i]) << i;
  }
  ASSERT_TRUE(cuda->Synchronize().ok());
}

// A step's parameters and gradients in page-locked memory (HostArray), as a worker keeps them,
// so that the copies are DMA transfers that really run beside the ops.
struct PinnedParams {
  std::vector<HostArray> values, grads;
  std::vector<std::vector<uint64_t>> keys;

  PinnedParams(Backend* backend, const OwnedParams& from) : keys(from.keys) {
    values.resize(from.values.size());
    grads.resize(from.values.size());
    for (size_t i = 0; i < from.values.size(); ++i) {
      EXPECT_TRUE(values[i].Resize(backend, from.values[i].size()).ok());
      EXPECT_TRUE(grads[i].Resize(backend, from.values[i].size()).ok());
      std::copy(from.values[i].begin(), from.values[i].end(), values[i].begin());
      std::fill(grads[i].begin(), grads[i].end(), testing::PoisonFloat());
    }
  }
  ParamValues view() const {
    ParamValues v;
    for (size_t i = 0; i < values.size(); ++i) {
      v.values.push_back(absl::MakeConstSpan(values[i].data(), values[i].size()));
      v.keys.push_back(keys[i]);
    }
    return v;
  }
  Gradients grad_view() {
    Gradients g;
    for (HostArray& a : grads) g.values.push_back(absl::MakeSpan(a.data(), a.size()));
    return g;
  }
};

// Steps as a worker overlaps them, on CUDA op by op and with recorded steps, from page-locked
// and from pageable memory, against the synchronous CUDA path and the CPU.
TEST(CudaStepOverlapTest, OverlappedStepsMatchTheSynchronousPathAndTheCpu) {
  std::unique_ptr<Backend> sync_backend = Cuda(false);
  if (sync_backend == nullptr) GTEST_SKIP() << "no CUDA device";
  auto cpu = CreateBackend("cpu", BackendOptions());
  ASSERT_TRUE(cpu.ok());
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", ", sync_backend->name()));
  std::mt19937_64 rng(seed);
  const std::vector<testing::ModelCase> cases = testing::DeviceModelCases({1024, 512});
  ModelOptions sync_options;
  sync_options.layer_gradient_copies = false;
  for (bool graphs : {false, true}) {
    for (bool pinned : {true, false}) {
      std::unique_ptr<Backend> overlap_backend = Cuda(graphs);
      ASSERT_NE(overlap_backend, nullptr);
      for (const testing::ModelCase& c : cases) {
        SCOPED_TRACE(absl::StrCat(c.spec.ShortDebugString(), graphs ? ", graphs" : "",
                                  pinned ? ", page-locked" : ", pageable"));
        auto on_cpu = CreateModel(c.spec, cpu->get());
        auto on_sync = CreateModel(c.spec, sync_backend.get(), sync_options);
        auto overlapped = CreateModel(c.spec, overlap_backend.get());
        ASSERT_TRUE(on_cpu.ok() && on_sync.ok() && overlapped.ok());
        // Every step's inputs first: step n+1's parameters exist while step n computes.
        const std::vector<int64_t> sizes = {128, 128, 7, 128, 300, 128, 128};
        std::vector<OwnedBatch> batches;
        std::vector<std::unique_ptr<OwnedParams>> owned;
        std::vector<std::unique_ptr<PinnedParams>> pinned_params;
        for (int64_t n : sizes) {
          batches.push_back(testing::BatchFor(c, rng, n));
          auto keys = (*on_cpu)->SparseKeys(batches.back().view());
          ASSERT_TRUE(keys.ok()) << keys.status();
          owned.push_back(std::make_unique<OwnedParams>(**on_cpu, *keys, rng, 0.05f));
          pinned_params.push_back(
              std::make_unique<PinnedParams>(overlap_backend.get(), *owned.back()));
        }
        auto values = [&](size_t i) {
          return pinned ? pinned_params[i]->view() : owned[i]->view();
        };
        for (size_t i = 0; i < sizes.size(); ++i) {
          SCOPED_TRACE(absl::StrCat("step ", i, " n ", sizes[i]));
          OwnedParams a = *owned[i], b = *owned[i];
          StepResult ra, rb, ro;
          ASSERT_TRUE((*on_cpu)->TrainStep(batches[i].view(), a.view(), a.grad_view(), &ra).ok());
          ASSERT_TRUE((*on_sync)->TrainStep(batches[i].view(), b.view(), b.grad_view(), &rb).ok());
          Gradients go = pinned ? pinned_params[i]->grad_view() : owned[i]->grad_view();
          absl::Status s = (*overlapped)->StartTrainStep(batches[i].view(), values(i), go);
          ASSERT_TRUE(s.ok()) << s;
          if (i + 1 < sizes.size()) {
            s = (*overlapped)->PrefetchParams(values(i + 1));
            ASSERT_TRUE(s.ok()) << s;
          }
          s = (*overlapped)->FinishStep(&ro);
          ASSERT_TRUE(s.ok()) << s;
          EXPECT_NEAR(ro.loss, rb.loss, 1e-6 * (1 + rb.loss));
          EXPECT_NEAR(ro.loss, ra.loss, 1e-5 * (1 + ra.loss));
          EXPECT_NEAR(ro.correct, ra.correct, 1);  // A near-tie may round either way.
          for (size_t p = 0; p < a.grads.size(); ++p) {
            double big = 0;
            for (float v : a.grads[p]) big = std::max(big, std::fabs(double(v)));
            const float* got = go.values[p].data();
            for (size_t j = 0; j < a.grads[p].size(); ++j) {
              ASSERT_NEAR(got[j], b.grads[p][j], 1e-6 + 1e-5 * big)
                  << (*on_cpu)->params()[p].name << "[" << j << "] against synchronous CUDA";
              ASSERT_NEAR(got[j], a.grads[p][j], 1e-6 + 1e-4 * big)
                  << (*on_cpu)->params()[p].name << "[" << j << "] against the CPU";
            }
          }
        }
        const auto* model = dynamic_cast<const GraphModel*>(overlapped->get());
        ASSERT_NE(model, nullptr);
        EXPECT_EQ(model->param_prefetch().taken(), static_cast<int64_t>(sizes.size()) - 1);
        if (graphs) {
          EXPECT_TRUE(model->step_graphs().failure().ok()) << model->step_graphs().failure();
        }
        std::printf("  %s%s, %s: %lld steps took prefetched parameters\n", c.spec.kind().c_str(),
                    graphs ? " (graphs)" : "", pinned ? "page-locked" : "pageable",
                    static_cast<long long>(model->param_prefetch().taken()));
      }
    }
  }
}

}  // namespace
}  // namespace pscluster::kernels
