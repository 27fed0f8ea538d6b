// Device-only checks of the CUDA backend against the CPU backend, for the GPU bundle: the radix
// select's adversarial digits and heavy ties (run_gpu_checks.sh runs the top-k cases 300 times,
// each case launched 4 times on the same data, so they are kept small), the softmax's argmax
// with NaN logits, and frees queued behind work that still reads the memory. Tagged gpu; skips
// without a device.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/create_backend.h"
#include "kernels/testing/test_util.h"

namespace pscluster::kernels {
namespace {

using testing::DeviceArray;

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cuda = CreateBackend("cuda", BackendOptions());
    if (!cuda.ok()) GTEST_SKIP() << "no CUDA device: " << cuda.status();
    auto cpu = CreateBackend("cpu", BackendOptions());
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cuda_ = std::move(*cuda);
    cpu_ = std::move(*cpu);
    seed_ = testing::FreshSeed();
    rng_.seed(seed_);
  }

  // TopKAbs on both backends; the CUDA answer must be the CPU's, bit for bit, in each of
  // `calls` launches on the same data (a race shows up as a launch that differs).
  void ExpectTopKMatches(const std::vector<float>& x, int64_t k, int calls = 4) {
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<int32_t> want_idx(k);
    std::vector<float> want_val(k);
    ASSERT_TRUE(cpu_->TopKAbs(n, x.data(), k, want_idx.data(), want_val.data()).ok());
    DeviceArray<float> dx(cuda_.get(), x), vals(cuda_.get(), k);
    DeviceArray<int32_t> idx(cuda_.get(), k);
    for (int call = 0; call < calls; ++call) {
      idx.Poison();
      vals.Poison();
      absl::Status s = cuda_->TopKAbs(n, dx.get(), k, idx.get(), vals.get());
      if (s.ok()) s = cuda_->Synchronize();
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_EQ(idx.Download(), want_idx) << "n=" << n << " k=" << k << " call " << call;
      const std::vector<float> got_val = vals.Download();
      ASSERT_EQ(std::memcmp(got_val.data(), want_val.data(), sizeof(float) * k), 0);
    }
  }

  std::unique_ptr<Backend> cuda_, cpu_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// 5 keys in a high digit and 10 in a lower one of the same pass, k = 10: the lower digit holds
// the 10th key and leaves 5 to take, exactly the high digit's count. A thread of the digit
// kernel that read `remaining` after the decision picked the high digit too.
TEST_F(CudaDeviceTest, TopKAdversarialDigitsInEveryPass) {
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  struct Pass { int shift; uint32_t high, low; };
  // The top byte of |x| stays below 0x80, so the first pass uses smaller digits.
  const Pass passes[] = {{24, 0x70, 0x3f}, {16, 200, 100}, {8, 200, 100}, {0, 200, 100}};
  std::uniform_int_distribution<uint32_t> low_bits(0, 0xffffu);
  for (const Pass& p : passes) {
    for (int64_t noise : {int64_t{0}, int64_t{1000}, int64_t{100000}}) {
      SCOPED_TRACE(absl::StrCat("shift ", p.shift, " noise ", noise));
      // Keys share the bytes above the pass's digit; below it they vary.
      const uint32_t above = p.shift == 24 ? 0u : 0x3f000000u;
      const uint32_t below_mask = p.shift == 0 ? 0u : (1u << p.shift) - 1;
      std::vector<float> x;
      for (int i = 0; i < 15; ++i) {
        const uint32_t digit = i < 5 ? p.high : p.low;
        const uint32_t bits = above | (digit << p.shift) | (low_bits(rng_) & below_mask);
        x.push_back(i % 2 ? FromBits(bits) : -FromBits(bits));
      }
      // Smaller magnitudes in other digits of the same pass, then shuffled positions.
      for (int64_t i = 0; i < noise; ++i) {
        const uint32_t digit = static_cast<uint32_t>(i % (p.low > 1 ? p.low - 1 : 1));
        x.push_back(FromBits(above | (digit << p.shift) | (low_bits(rng_) & below_mask)));
      }
      std::shuffle(x.begin(), x.end(), rng_);
      ExpectTopKMatches(x, 10);
    }
  }
}

TEST_F(CudaDeviceTest, TopKRandomSizesAndHeavyTies) {
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  std::uniform_int_distribution<int64_t> size(1, 100000);
  std::uniform_int_distribution<int> levels(1, 40);
  for (int rep = 0; rep < 4; ++rep) {
    const int64_t n = size(rng_);
    const int distinct = levels(rng_);
    std::vector<float> x = testing::RandomFloats(rng_, n, -1, 1);
    if (rep % 2) {
      for (float& v : x) v = std::round(v * distinct) / distinct;  // Ties at the threshold.
    }
    std::uniform_int_distribution<int64_t> pick_k(1, n);
    ExpectTopKMatches(x, pick_k(rng_));
  }
}

// The accuracy count (row_stats[2i + 1]) must be the CPU's for rows with NaN logits anywhere.
TEST_F(CudaDeviceTest, SoftmaxArgmaxWithNaNLogitsMatchesTheCpu) {
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::uniform_int_distribution<int> coin(0, 9);
  for (int64_t classes : {1, 3, 10, 32, 33, 100, 1000}) {
    const int64_t rows = 257;
    std::vector<float> logits = testing::RandomFloats(rng_, rows * classes, -4, 4);
    std::vector<int32_t> labels(rows);
    for (int64_t r = 0; r < rows; ++r) {
      float* z = logits.data() + r * classes;
      // A NaN first, as some lane's first element, or scattered; then put the label at the
      // largest remaining logit half of the time, so the count is exercised both ways.
      if (r % 4 == 0) z[0] = nan;
      if (r % 4 == 1 && classes > 1) z[1 + r % std::min<int64_t>(classes - 1, 31)] = nan;
      for (int64_t j = 0; j < classes; ++j) {
        if (r % 4 == 2 && coin(rng_) == 0) z[j] = nan;
      }
      int64_t best = 0;
      for (int64_t j = 1; j < classes; ++j) {
        if (z[j] > z[best]) best = j;
      }
      labels[r] = static_cast<int32_t>(coin(rng_) < 5 ? best : (r * 7) % classes);
    }
    std::vector<float> want(2 * rows);
    ASSERT_TRUE(cpu_->SoftmaxCrossEntropy(rows, classes, logits.data(), labels.data(), 1.0f,
                                          nullptr, want.data())
                    .ok());
    DeviceArray<float> dl(cuda_.get(), logits), stats(cuda_.get(), 2 * rows);
    DeviceArray<int32_t> dlab(cuda_.get(), labels);
    stats.Poison();
    absl::Status s = cuda_->SoftmaxCrossEntropy(rows, classes, dl.get(), dlab.get(), 1.0f,
                                                nullptr, stats.get());
    if (s.ok()) s = cuda_->Synchronize();
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<float> got = stats.Download();
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(got[2 * r + 1], want[2 * r + 1]) << "classes " << classes << " row " << r;
      ASSERT_EQ(std::isnan(got[2 * r]), std::isnan(want[2 * r])) << "row " << r;
    }
  }
}

// A buffer freed while queued work still reads it, and its memory handed out again at once and
// overwritten: the queued work must still see the old contents (frees are stream-ordered).
TEST_F(CudaDeviceTest, FreedMemoryIsReusedOnlyAfterTheWorkQueuedBeforeTheFree) {
  const int64_t n = int64_t{64} << 20;  // 256 MiB: the reads take long enough to overlap.
  for (int rep = 0; rep < 5; ++rep) {
    auto src = cuda_->Allocate(sizeof(float) * n);
    auto dst = cuda_->Allocate(sizeof(float) * n);
    ASSERT_TRUE(src.ok() && dst.ok());
    ASSERT_TRUE(cuda_->Fill(n, -2.0f - rep, src->as<float>()).ok());
    for (int i = 0; i < 4; ++i) {  // Several passes over src, none waited for.
      ASSERT_TRUE(cuda_->ActivationBackward(Activation::kRelu, n, src->as<float>(),
                                            src->as<float>(), dst->as<float>())
                      .ok());
      ASSERT_TRUE(cuda_->CopyOnDevice(src->as<float>(), dst->as<float>(), sizeof(float) * n).ok());
    }
    src->Reset();
    auto again = cuda_->Allocate(sizeof(float) * n);
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE(cuda_->Fill(n, 5.0f, again->as<float>()).ok());
    ASSERT_TRUE(cuda_->Synchronize().ok());
    std::vector<float> head(4096), tail(4096);
    ASSERT_TRUE(cuda_->CopyToHost(dst->as<float>(), head.data(), sizeof(float) * 4096).ok());
    ASSERT_TRUE(cuda_->CopyToHost(dst->as<float>() + n - 4096, tail.data(), 4 * 4096).ok());
    ASSERT_TRUE(cuda_->Synchronize().ok());
    for (int i = 0; i < 4096; ++i) {
      ASSERT_EQ(head[i], -2.0f - rep) << i;
      ASSERT_EQ(tail[i], -2.0f - rep) << i;
    }
  }
}

// Scratch memory grows in the middle of queued work (a small top-k, then one large enough to
// outgrow the first scratch, with no wait in between): the first call's results must stand.
TEST_F(CudaDeviceTest, ScratchGrowthBehindQueuedWork) {
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  auto fresh = CreateBackend("cuda", BackendOptions());  // Its scratch starts at 1 MiB.
  ASSERT_TRUE(fresh.ok());
  Backend* b = fresh->get();
  // The top-k scratch needs 8 bytes per 4096 elements: past 1 MiB beyond 2^29 elements.
  const int64_t small = 5000, large = int64_t{5} << 27, k = 64, window = 1 << 20;
  const int64_t offset = large - window - 12345;
  std::vector<float> xs = testing::RandomFloats(rng_, small, -1, 1);
  std::vector<float> xw = testing::RandomFloats(rng_, window, -1, 1);
  DeviceArray<float> ds(b, xs), dl(b, large);
  // |x| = 0.5 except in the window, whose values reach 1: the top k all lie in the window.
  ASSERT_TRUE(b->Fill(large, -0.5f, dl.get()).ok());
  ASSERT_TRUE(b->CopyToDevice(xw.data(), dl.get() + offset, sizeof(float) * window).ok());
  ASSERT_TRUE(b->Synchronize().ok());
  DeviceArray<int32_t> is(b, k), il(b, k);
  ASSERT_TRUE(b->TopKAbs(small, ds.get(), k, is.get(), nullptr).ok());
  ASSERT_TRUE(b->TopKAbs(large, dl.get(), k, il.get(), nullptr).ok());
  ASSERT_TRUE(b->Synchronize().ok());
  std::vector<int32_t> want_s(k), want_l(k);
  ASSERT_TRUE(cpu_->TopKAbs(small, xs.data(), k, want_s.data(), nullptr).ok());
  ASSERT_TRUE(cpu_->TopKAbs(window, xw.data(), k, want_l.data(), nullptr).ok());
  for (int32_t& i : want_l) i += static_cast<int32_t>(offset);
  EXPECT_EQ(is.Download(), want_s);
  EXPECT_EQ(il.Download(), want_l);
}

}  // namespace
}  // namespace pscluster::kernels
