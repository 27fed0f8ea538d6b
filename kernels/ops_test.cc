// Every backend op against its float64 reference (kernels/testing/reference_ops.h), with fresh
// random inputs each run and every output poisoned before the op writes it. Built twice: as
// ops_cpu_test (KERNELS_TEST_DEVICE "cpu") and as ops_cuda_test ("cuda", tagged gpu), which
// skips itself where no CUDA device is usable.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "kernels/create_backend.h"
#include "common/half_bits.h"
#include "kernels/testing/reference_ops.h"
#include "kernels/testing/test_util.h"

#ifndef KERNELS_TEST_DEVICE
#error "KERNELS_TEST_DEVICE must name the backend under test"
#endif

namespace pscluster::kernels {
namespace {

using testing::DeviceArray;
using testing::FreshSeed;
using testing::PoisonFloat;
using testing::RandomFloats;
using testing::RandomInts;
using testing::WithinBounds;

class OpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = CreateBackend(KERNELS_TEST_DEVICE, BackendOptions());
    if (!backend.ok()) {
      if (std::string(KERNELS_TEST_DEVICE) == "cuda") {
        GTEST_SKIP() << "no CUDA device: " << backend.status();
      }
      FAIL() << backend.status();
    }
    backend_ = std::move(*backend);
    seed_ = FreshSeed();
    rng_.seed(seed_);
    RecordProperty("seed", std::to_string(seed_));
  }
  // The status of an op together with the next Synchronize(): asynchronous backends report
  // device-side errors (bad indices) there.
  absl::Status Run(absl::Status op) {
    absl::Status sync = backend_->Synchronize();
    return op.ok() ? sync : op;
  }
  std::string Seed() const { return absl::StrCat("seed ", seed_); }

  std::unique_ptr<Backend> backend_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

#define EXPECT_CODE(expr, want)                                    \
  do {                                                             \
    absl::Status s_ = (expr);                                      \
    EXPECT_EQ(s_.code(), absl::StatusCode::want) << s_.ToString(); \
  } while (0)

TEST_F(OpsTest, GemmAllTransposesAgainstFloat64) {
  SCOPED_TRACE(Seed());
  struct Shape { int64_t m, n, k; };
  const Shape shapes[] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {128, 96, 200}, {200, 300, 257},
                          {RandomInts(rng_, 1, 1, 90)[0], RandomInts(rng_, 1, 1, 90)[0],
                           RandomInts(rng_, 1, 1, 300)[0]}};
  for (const Shape& s : shapes) {
    for (Trans ta : {Trans::kNo, Trans::kYes}) {
      for (Trans tb : {Trans::kNo, Trans::kYes}) {
        for (float beta : {0.0f, 0.75f}) {
          SCOPED_TRACE(absl::StrCat("m=", s.m, " n=", s.n, " k=", s.k, " ta=", ta == Trans::kYes,
                                    " tb=", tb == Trans::kYes, " beta=", beta));
          const float alpha = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng_);
          std::vector<float> a = RandomFloats(rng_, s.m * s.k, -2, 2);
          std::vector<float> b = RandomFloats(rng_, s.k * s.n, -2, 2);
          // With beta == 0 the old C must be ignored: poison it with NaN.
          std::vector<float> c = beta == 0.0f ? std::vector<float>(s.m * s.n, PoisonFloat())
                                              : RandomFloats(rng_, s.m * s.n);
          DeviceArray<float> da(backend_.get(), a), db(backend_.get(), b), dc(backend_.get(), c);
          ASSERT_TRUE(Run(backend_->Gemm(ta, tb, s.m, s.n, s.k, alpha, da.get(), db.get(), beta,
                                         dc.get()))
                          .ok());
          EXPECT_TRUE(WithinBounds(dc.Download(),
                                   testing::RefGemm(ta, tb, s.m, s.n, s.k, alpha, a, b, beta, c)));
        }
      }
    }
  }
}

TEST_F(OpsTest, GemmWithEmptyInnerDimensionScalesC) {
  std::vector<float> c = {1, 2, 3, 4, 5, 6};
  DeviceArray<float> dc(backend_.get(), c);
  ASSERT_TRUE(Run(backend_->Gemm(Trans::kNo, Trans::kNo, 2, 3, 0, 1.0f, nullptr, nullptr, 2.0f,
                                 dc.get()))
                  .ok());
  EXPECT_EQ(dc.Download(), std::vector<float>({2, 4, 6, 8, 10, 12}));
  dc.Poison();
  ASSERT_TRUE(Run(backend_->Gemm(Trans::kNo, Trans::kNo, 2, 3, 0, 1.0f, nullptr, nullptr, 0.0f,
                                 dc.get()))
                  .ok());
  EXPECT_EQ(dc.Download(), std::vector<float>(6, 0.0f));
}

TEST_F(OpsTest, AddBiasInAndOutOfPlace) {
  SCOPED_TRACE(Seed());
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {37, 129}, {300, 256}}) {
    std::vector<float> x = RandomFloats(rng_, rows * cols, -10, 10);
    std::vector<float> bias = RandomFloats(rng_, cols, -10, 10);
    DeviceArray<float> dx(backend_.get(), x), db(backend_.get(), bias), dy(backend_.get(), rows * cols);
    dy.Poison();
    ASSERT_TRUE(Run(backend_->AddBias(rows, cols, dx.get(), db.get(), dy.get())).ok());
    EXPECT_TRUE(WithinBounds(dy.Download(), testing::RefAddBias(rows, cols, x, bias)));
    ASSERT_TRUE(Run(backend_->AddBias(rows, cols, dx.get(), db.get(), dx.get())).ok());
    EXPECT_TRUE(WithinBounds(dx.Download(), testing::RefAddBias(rows, cols, x, bias)));
  }
}

TEST_F(OpsTest, ColumnSumShapesAndAccumulation) {
  SCOPED_TRACE(Seed());
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {5000, 2}, {7, 513}, {64, 64},
                            {100000, 3}, {1, 4097}}) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(absl::StrCat(rows, "x", cols, " accumulate=", accumulate));
      std::vector<float> x = RandomFloats(rng_, rows * cols, -3, 3);
      std::vector<float> out = accumulate ? RandomFloats(rng_, cols, -3, 3)
                                          : std::vector<float>(cols, PoisonFloat());
      DeviceArray<float> dx(backend_.get(), x), dout(backend_.get(), out);
      ASSERT_TRUE(Run(backend_->ColumnSum(rows, cols, dx.get(), accumulate, dout.get())).ok());
      EXPECT_TRUE(WithinBounds(dout.Download(),
                               testing::RefColumnSum(rows, cols, x, accumulate, out)));
    }
  }
}

std::vector<float> ActivationInputs(std::mt19937_64& rng, int64_t n) {
  std::vector<float> x = RandomFloats(rng, n, -9, 9);
  // Values at and around the interesting points, and some tiny ones.
  const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-7f, -0.7518f, 0.5f, -12.0f, 12.0f,
                           30.0f, -30.0f};
  for (size_t i = 0; i < sizeof(special) / sizeof(special[0]) && i < x.size(); ++i) x[i] = special[i];
  return x;
}

TEST_F(OpsTest, ActivationsForwardAndBackward) {
  SCOPED_TRACE(Seed());
  for (Activation f : {Activation::kRelu, Activation::kGelu}) {
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
      SCOPED_TRACE(absl::StrCat(ActivationName(f), " n=", n));
      std::vector<float> x = ActivationInputs(rng_, n);
      std::vector<float> dy = RandomFloats(rng_, n, -2, 2);
      DeviceArray<float> dx_in(backend_.get(), x), ddy(backend_.get(), dy);
      DeviceArray<float> y(backend_.get(), n), dx(backend_.get(), n);
      y.Poison();
      dx.Poison();
      ASSERT_TRUE(Run(backend_->ActivationForward(f, n, dx_in.get(), y.get())).ok());
      EXPECT_TRUE(WithinBounds(y.Download(), testing::RefActivationForward(f, x)));
      ASSERT_TRUE(Run(backend_->ActivationBackward(f, n, dx_in.get(), ddy.get(), dx.get())).ok());
      EXPECT_TRUE(WithinBounds(dx.Download(), testing::RefActivationBackward(f, x, dy)));
      // In place: dx may be dy, y may be x.
      ASSERT_TRUE(Run(backend_->ActivationBackward(f, n, dx_in.get(), ddy.get(), ddy.get())).ok());
      EXPECT_TRUE(WithinBounds(ddy.Download(), testing::RefActivationBackward(f, x, dy)));
      ASSERT_TRUE(Run(backend_->ActivationForward(f, n, dx_in.get(), dx_in.get())).ok());
      EXPECT_TRUE(WithinBounds(dx_in.Download(), testing::RefActivationForward(f, x)));
    }
  }
}

TEST_F(OpsTest, ReluPropagatesNaN) {
  DeviceArray<float> x(backend_.get(), std::vector<float>{std::nanf(""), -1.0f, 2.0f});
  DeviceArray<float> y(backend_.get(), 3);
  ASSERT_TRUE(Run(backend_->ActivationForward(Activation::kRelu, 3, x.get(), y.get())).ok());
  std::vector<float> got = y.Download();
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_EQ(got[1], 0.0f);
  EXPECT_EQ(got[2], 2.0f);
}

TEST_F(OpsTest, SoftmaxCrossEntropyIsStableAndCountsCorrect) {
  SCOPED_TRACE(Seed());
  struct Case { int64_t rows, classes; float scale; };
  // Large logits would overflow exp() without the max shift.
  const Case cases[] = {{1, 1, 1}, {64, 2, 5}, {300, 10, 20}, {33, 1000, 3}, {50, 10, 2000}};
  for (const Case& c : cases) {
    for (bool with_grad : {true, false}) {
      SCOPED_TRACE(absl::StrCat(c.rows, "x", c.classes, " scale=", c.scale, " grad=", with_grad));
      std::vector<float> logits = RandomFloats(rng_, c.rows * c.classes, -c.scale, c.scale);
      std::vector<int32_t> labels = RandomInts(rng_, c.rows, 0, static_cast<int32_t>(c.classes));
      // Make some predictions right so the accuracy count is exercised both ways.
      for (int64_t i = 0; i < c.rows; i += 3) logits[i * c.classes + labels[i]] = c.scale * 2;
      const float grad_scale = 1.0f / static_cast<float>(c.rows);
      DeviceArray<float> dl(backend_.get(), logits), dg(backend_.get(), c.rows * c.classes);
      DeviceArray<int32_t> dlab(backend_.get(), labels);
      DeviceArray<float> stats(backend_.get(), 2 * c.rows);
      dg.Poison();
      stats.Poison();
      ASSERT_TRUE(Run(backend_->SoftmaxCrossEntropy(c.rows, c.classes, dl.get(), dlab.get(),
                                                    grad_scale, with_grad ? dg.get() : nullptr,
                                                    stats.get()))
                      .ok());
      testing::Reference ref_grad, ref_stats;
      testing::RefSoftmaxCrossEntropy(c.rows, c.classes, logits, labels, grad_scale, &ref_grad,
                                      &ref_stats);
      EXPECT_TRUE(WithinBounds(stats.Download(), ref_stats));
      if (with_grad) {
        EXPECT_TRUE(WithinBounds(dg.Download(), ref_grad));
      }
    }
  }
}

TEST_F(OpsTest, SoftmaxCrossEntropyGradientMayOverwriteLogits) {
  SCOPED_TRACE(Seed());
  const int64_t rows = 40, classes = 10;
  std::vector<float> logits = RandomFloats(rng_, rows * classes, -5, 5);
  std::vector<int32_t> labels = RandomInts(rng_, rows, 0, classes);
  DeviceArray<float> dl(backend_.get(), logits), stats(backend_.get(), 2 * rows);
  DeviceArray<int32_t> dlab(backend_.get(), labels);
  ASSERT_TRUE(Run(backend_->SoftmaxCrossEntropy(rows, classes, dl.get(), dlab.get(), 0.5f,
                                                dl.get(), stats.get()))
                  .ok());
  testing::Reference ref_grad, ref_stats;
  testing::RefSoftmaxCrossEntropy(rows, classes, logits, labels, 0.5f, &ref_grad, &ref_stats);
  EXPECT_TRUE(WithinBounds(dl.Download(), ref_grad));
  EXPECT_TRUE(WithinBounds(stats.Download(), ref_stats));
}

TEST_F(OpsTest, SoftmaxCrossEntropyRejectsBadLabels) {
  DeviceArray<float> logits(backend_.get(), std::vector<float>(6, 0.5f));
  DeviceArray<float> stats(backend_.get(), 4);
  for (int32_t bad : {-1, 3, std::numeric_limits<int32_t>::max()}) {
    DeviceArray<int32_t> labels(backend_.get(), std::vector<int32_t>{0, bad});
    EXPECT_CODE(Run(backend_->SoftmaxCrossEntropy(2, 3, logits.get(), labels.get(), 1.0f, nullptr,
                                                  stats.get())),
                kInvalidArgument);
  }
  // The backend is usable afterwards.
  DeviceArray<int32_t> labels(backend_.get(), std::vector<int32_t>{0, 2});
  EXPECT_TRUE(Run(backend_->SoftmaxCrossEntropy(2, 3, logits.get(), labels.get(), 1.0f, nullptr,
                                                stats.get()))
                  .ok());
}

TEST_F(OpsTest, GatherRows) {
  SCOPED_TRACE(Seed());
  for (int64_t width : {int64_t{1}, int64_t{3}, int64_t{64}, int64_t{257}}) {
    const int64_t rows = 50, n = 777;
    std::vector<float> table = RandomFloats(rng_, rows * width);
    std::vector<int32_t> idx = RandomInts(rng_, n, 0, rows);
    DeviceArray<float> dt(backend_.get(), table), out(backend_.get(), n * width);
    DeviceArray<int32_t> di(backend_.get(), idx);
    out.Poison();
    ASSERT_TRUE(Run(backend_->GatherRows(n, width, dt.get(), rows, di.get(), out.get())).ok());
    EXPECT_EQ(out.Download(), testing::RefGatherRows(width, table, idx));
  }
}

TEST_F(OpsTest, ScatterAddRowsWithManyDuplicates) {
  SCOPED_TRACE(Seed());
  for (int64_t width : {int64_t{1}, int64_t{8}, int64_t{64}, int64_t{200}}) {
    SCOPED_TRACE(absl::StrCat("width ", width));
    // 20,000 updates into 5 rows: every row is hit ~4,000 times in one call.
    const int64_t rows = 5, n = 20000;
    std::vector<float> src = RandomFloats(rng_, n * width);
    std::vector<int32_t> idx = RandomInts(rng_, n, 0, rows);
    std::vector<float> table = RandomFloats(rng_, rows * width);
    DeviceArray<float> ds(backend_.get(), src), dt(backend_.get(), table);
    DeviceArray<int32_t> di(backend_.get(), idx);
    ASSERT_TRUE(Run(backend_->ScatterAddRows(n, width, ds.get(), di.get(), rows, dt.get())).ok());
    EXPECT_TRUE(WithinBounds(dt.Download(), testing::RefScatterAddRows(width, src, idx, table)));
  }
}

TEST_F(OpsTest, ScatterAddLosesNoUpdateCountedExactly) {
  SCOPED_TRACE(Seed());
  // Adding 1.0 is exact in float32 up to 2^24, so any lost (or doubled) update shows as an
  // integer mismatch.
  const int64_t rows = 3, width = 96, n = 150000;
  std::vector<int32_t> idx = RandomInts(rng_, n, 0, rows);
  std::vector<double> expected(rows, 0);
  for (int32_t i : idx) expected[i] += 1;
  DeviceArray<float> ds(backend_.get(), std::vector<float>(n * width, 1.0f));
  DeviceArray<float> dt(backend_.get(), std::vector<float>(rows * width, 0.0f));
  DeviceArray<int32_t> di(backend_.get(), idx);
  ASSERT_TRUE(Run(backend_->ScatterAddRows(n, width, ds.get(), di.get(), rows, dt.get())).ok());
  std::vector<float> got = dt.Download();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < width; ++c) ASSERT_EQ(got[r * width + c], expected[r]) << r << "," << c;
  }
}

TEST_F(OpsTest, RowOpsRejectIndicesOutOfRange) {
  DeviceArray<float> table(backend_.get(), std::vector<float>(8, 1.0f));
  DeviceArray<float> buf(backend_.get(), std::vector<float>(8, 2.0f));
  for (int32_t bad : {-1, 4, 1 << 30}) {
    DeviceArray<int32_t> idx(backend_.get(), std::vector<int32_t>{0, bad, 1, 2});
    EXPECT_CODE(Run(backend_->GatherRows(4, 2, table.get(), 4, idx.get(), buf.get())),
                kInvalidArgument);
    EXPECT_CODE(Run(backend_->ScatterAddRows(4, 2, buf.get(), idx.get(), 4, table.get())),
                kInvalidArgument);
  }
  if (backend_->kind() == DeviceKind::kCpu) {
    // The CPU backend checks before it writes: nothing changed.
    EXPECT_EQ(table.Download(), std::vector<float>(8, 1.0f));
  }
}

// A random CSR batch of `bags` bags over `rows` table rows, with empty bags and duplicate keys.
struct Csr {
  std::vector<int32_t> offsets, idx;
  std::vector<float> weights;
};
Csr RandomCsr(std::mt19937_64& rng, int64_t bags, int64_t rows, int max_per_bag) {
  Csr c;
  c.offsets.push_back(0);
  std::uniform_int_distribution<int> len(0, max_per_bag);
  for (int64_t b = 0; b < bags; ++b) {
    const int l = b % 7 == 3 ? 0 : len(rng);
    for (int j = 0; j < l; ++j) c.idx.push_back(RandomInts(rng, 1, 0, rows)[0]);
    c.offsets.push_back(static_cast<int32_t>(c.idx.size()));
  }
  c.weights = RandomFloats(rng, c.idx.size(), -2, 2);
  return c;
}

TEST_F(OpsTest, EmbeddingBagForwardAndBackward) {
  SCOPED_TRACE(Seed());
  for (int64_t width : {int64_t{1}, int64_t{2}, int64_t{16}, int64_t{100}}) {
    for (int64_t rows : {int64_t{3}, int64_t{1000}}) {
      SCOPED_TRACE(absl::StrCat("width ", width, " rows ", rows));
      const int64_t bags = 129;
      Csr csr = RandomCsr(rng_, bags, rows, 60);
      const int64_t nnz = csr.idx.size();
      std::vector<float> table = RandomFloats(rng_, rows * width);
      DeviceArray<int32_t> doff(backend_.get(), csr.offsets), didx(backend_.get(), csr.idx);
      DeviceArray<float> dw(backend_.get(), csr.weights), dt(backend_.get(), table);
      DeviceArray<float> out(backend_.get(), bags * width);
      out.Poison();
      ASSERT_TRUE(Run(backend_->EmbeddingBagForward(bags, width, nnz, doff.get(), didx.get(),
                                                    dw.get(), dt.get(), rows, out.get()))
                      .ok());
      EXPECT_TRUE(WithinBounds(out.Download(), testing::RefEmbeddingBagForward(
                                                   width, csr.offsets, csr.idx, csr.weights,
                                                   table)));
      std::vector<float> dout = RandomFloats(rng_, bags * width);
      std::vector<float> grad = RandomFloats(rng_, rows * width);
      DeviceArray<float> ddout(backend_.get(), dout), dgrad(backend_.get(), grad);
      ASSERT_TRUE(Run(backend_->EmbeddingBagBackward(bags, width, nnz, doff.get(), didx.get(),
                                                     dw.get(), ddout.get(), rows, dgrad.get()))
                      .ok());
      EXPECT_TRUE(WithinBounds(dgrad.Download(), testing::RefEmbeddingBagBackward(
                                                     width, csr.offsets, csr.idx, csr.weights,
                                                     dout, grad)));
    }
  }
}

TEST_F(OpsTest, EmbeddingBagRejectsBadOffsetsAndIndices) {
  DeviceArray<float> table(backend_.get(), std::vector<float>(8, 1.0f));
  DeviceArray<float> out(backend_.get(), 4);
  DeviceArray<float> w(backend_.get(), std::vector<float>(3, 1.0f));
  DeviceArray<int32_t> good_idx(backend_.get(), std::vector<int32_t>{0, 1, 3});
  DeviceArray<int32_t> bad_idx(backend_.get(), std::vector<int32_t>{0, 9, 3});
  DeviceArray<int32_t> good_off(backend_.get(), std::vector<int32_t>{0, 2, 3});
  DeviceArray<int32_t> falling(backend_.get(), std::vector<int32_t>{0, 3, 2});
  DeviceArray<int32_t> too_far(backend_.get(), std::vector<int32_t>{0, 2, 4});
  EXPECT_TRUE(Run(backend_->EmbeddingBagForward(2, 2, 3, good_off.get(), good_idx.get(), w.get(),
                                                table.get(), 4, out.get()))
                  .ok());
  EXPECT_CODE(Run(backend_->EmbeddingBagForward(2, 2, 3, good_off.get(), bad_idx.get(), w.get(),
                                                table.get(), 4, out.get())),
              kInvalidArgument);
  EXPECT_CODE(Run(backend_->EmbeddingBagForward(2, 2, 3, falling.get(), good_idx.get(), w.get(),
                                                table.get(), 4, out.get())),
              kInvalidArgument);
  EXPECT_CODE(Run(backend_->EmbeddingBagBackward(2, 2, 3, too_far.get(), good_idx.get(), w.get(),
                                                 out.get(), 4, table.get())),
              kInvalidArgument);
  EXPECT_CODE(Run(backend_->EmbeddingBagBackward(2, 2, 3, good_off.get(), bad_idx.get(), w.get(),
                                                 out.get(), 4, table.get())),
              kInvalidArgument);
}

std::vector<float> CastInputs(std::mt19937_64& rng, int64_t n) {
  // Every class of float: random bit patterns (NaNs, infinities, subnormals included), values
  // around fp16's range edges and exact halfway cases.
  std::vector<float> x(n);
  std::uniform_int_distribution<uint32_t> bits;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b = bits(rng);
    if (i % 3 == 1) b = (b & 0x807fffffu) | ((100u + (b >> 24) % 56) << 23);  // |x| in fp16 range
    if (i % 3 == 2) b = (b & 0x80000000u) | (b & 0x7fffe000u) | 0x1000u;       // fp16 ties
    std::memcpy(&x[i], &b, 4);
  }
  const float special[] = {0.0f, -0.0f, 65504.0f, 65520.0f, 65519.0f, 6.1e-5f, 5.96e-8f,
                           2.98e-8f, std::numeric_limits<float>::infinity(), std::nanf("")};
  for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); ++i) x[i] = special[i];
  return x;
}

TEST_F(OpsTest, HalfCastsMatchCommonDtypeBitForBit) {
  SCOPED_TRACE(Seed());
  const int64_t n = 200001;
  std::vector<float> x = CastInputs(rng_, n);
  DeviceArray<float> dx(backend_.get(), x), back(backend_.get(), n);
  DeviceArray<int32_t> scratch(backend_.get(), (n + 1) / 2);  // n uint16 values.
  auto* h = reinterpret_cast<uint16_t*>(scratch.get());
  for (HalfType t : {HalfType::kFloat16, HalfType::kBFloat16}) {
    SCOPED_TRACE(t == HalfType::kFloat16 ? "float16" : "bfloat16");
    scratch.Poison();
    back.Poison();
    ASSERT_TRUE(Run(backend_->CastToHalf(t, n, dx.get(), h)).ok());
    ASSERT_TRUE(Run(backend_->CastFromHalf(t, n, h, back.get())).ok());
    std::vector<int32_t> packed = scratch.Download();
    std::vector<uint16_t> got(n);
    std::memcpy(got.data(), packed.data(), n * sizeof(uint16_t));
    std::vector<float> round_trip = back.Download();
    int mismatches = 0;
    for (int64_t i = 0; i < n && mismatches < 5; ++i) {
      const uint16_t want = t == HalfType::kFloat16 ? FloatToHalf(x[i]) : FloatToBFloat16(x[i]);
      const float want_back = t == HalfType::kFloat16 ? HalfToFloat(want) : BFloat16ToFloat(want);
      uint32_t got_bits, want_bits;
      std::memcpy(&got_bits, &round_trip[i], 4);
      std::memcpy(&want_bits, &want_back, 4);
      if (got[i] != want || got_bits != want_bits) {
        ++mismatches;
        ADD_FAILURE() << "x[" << i << "] = " << x[i] << ": got " << got[i] << " want " << want;
      }
    }
  }
}

TEST_F(OpsTest, TopKAbsMatchesReferenceWithTiesAndNaN) {
  SCOPED_TRACE(Seed());
  for (int64_t n : {int64_t{1}, int64_t{10}, int64_t{1000}, int64_t{65536}, int64_t{300001}}) {
    for (bool ties : {false, true}) {
      std::vector<float> x = RandomFloats(rng_, n, -5, 5);
      if (ties) {  // Few distinct magnitudes: the threshold value repeats many times.
        for (float& v : x) v = std::round(v);
      }
      if (n > 100) x[n / 2] = std::nanf("");
      for (int64_t k : {int64_t{1}, std::max<int64_t>(1, n / 100), n / 2 + 1, n}) {
        SCOPED_TRACE(absl::StrCat("n=", n, " k=", k, " ties=", ties));
        DeviceArray<float> dx(backend_.get(), x), vals(backend_.get(), k);
        DeviceArray<int32_t> idx(backend_.get(), k);
        idx.Poison();
        vals.Poison();
        ASSERT_TRUE(Run(backend_->TopKAbs(n, dx.get(), k, idx.get(), vals.get())).ok());
        const std::vector<int32_t> want = testing::RefTopKAbs(x, k);
        const std::vector<int32_t> got = idx.Download();
        ASSERT_EQ(got, want);
        const std::vector<float> got_vals = vals.Download();
        for (int64_t i = 0; i < k; ++i) {
          EXPECT_EQ(std::memcmp(&got_vals[i], &x[want[i]], 4), 0) << i;
        }
      }
    }
  }
}

TEST_F(OpsTest, Im2ColAndCol2Im) {
  SCOPED_TRACE(Seed());
  const ConvGeometry geometries[] = {
      {2, 28, 28, 1, 5, 5, 2, 2, 1},  // The CNN's first layer.
      {3, 14, 14, 16, 5, 5, 2, 2, 1},
      {2, 9, 7, 3, 3, 3, 1, 1, 2},
      {1, 6, 5, 2, 3, 2, 0, 1, 1},
      {4, 5, 5, 8, 1, 1, 0, 0, 1},
  };
  for (const ConvGeometry& g : geometries) {
    SCOPED_TRACE(absl::StrCat(g.batch, "x", g.height, "x", g.width, "x", g.channels, " k",
                              g.kernel_h, "x", g.kernel_w, " p", g.pad_h, ",", g.pad_w, " s",
                              g.stride));
    std::vector<float> x = RandomFloats(rng_, g.input_size());
    const int64_t cols_size = g.num_patches() * g.patch_size();
    DeviceArray<float> dx(backend_.get(), x), cols(backend_.get(), cols_size);
    cols.Poison();
    ASSERT_TRUE(Run(backend_->Im2Col(g, dx.get(), cols.get())).ok());
    EXPECT_EQ(cols.Download(), testing::RefIm2Col(g, x));
    std::vector<float> c = RandomFloats(rng_, cols_size);
    cols.Upload(c);
    dx.Poison();
    ASSERT_TRUE(Run(backend_->Col2Im(g, cols.get(), dx.get())).ok());
    EXPECT_TRUE(WithinBounds(dx.Download(), testing::RefCol2Im(g, c)));
  }
}

TEST_F(OpsTest, MaxPoolForwardAndBackward) {
  SCOPED_TRACE(Seed());
  const PoolGeometry geometries[] = {
      {3, 28, 28, 16, 2, 2}, {2, 14, 14, 32, 2, 2}, {2, 7, 9, 5, 3, 2}, {1, 5, 5, 1, 5, 1}};
  for (const PoolGeometry& g : geometries) {
    SCOPED_TRACE(absl::StrCat(g.batch, "x", g.height, "x", g.width, "x", g.channels, " w",
                              g.window, " s", g.stride));
    std::vector<float> x = RandomFloats(rng_, g.input_size());
    DeviceArray<float> dx(backend_.get(), x), y(backend_.get(), g.output_size());
    DeviceArray<int32_t> am(backend_.get(), g.output_size());
    y.Poison();
    am.Poison();
    ASSERT_TRUE(Run(backend_->MaxPoolForward(g, dx.get(), y.get(), am.get())).ok());
    std::vector<float> want_y;
    std::vector<int32_t> want_am;
    testing::RefMaxPoolForward(g, x, &want_y, &want_am);
    EXPECT_EQ(y.Download(), want_y);
    EXPECT_EQ(am.Download(), want_am);
    std::vector<float> dy = RandomFloats(rng_, g.output_size());
    y.Upload(dy);
    dx.Poison();
    ASSERT_TRUE(Run(backend_->MaxPoolBackward(g, y.get(), am.get(), dx.get())).ok());
    EXPECT_TRUE(WithinBounds(dx.Download(), testing::RefMaxPoolBackward(g, dy, want_am)));
  }
}

TEST_F(OpsTest, MaxPoolLetsNaNThrough) {
  PoolGeometry g{1, 2, 2, 1, 2, 2};
  DeviceArray<float> x(backend_.get(), std::vector<float>{1.0f, std::nanf(""), 5.0f, 2.0f});
  DeviceArray<float> y(backend_.get(), 1);
  DeviceArray<int32_t> am(backend_.get(), 1);
  ASSERT_TRUE(Run(backend_->MaxPoolForward(g, x.get(), y.get(), am.get())).ok());
  EXPECT_TRUE(std::isnan(y.Download()[0]));
  EXPECT_EQ(am.Download()[0], 1);
}

TEST_F(OpsTest, InvalidArgumentsAreRejectedBeforeAnythingRuns) {
  DeviceArray<float> a(backend_.get(), std::vector<float>(4, 1.0f));
  EXPECT_CODE(backend_->Gemm(Trans::kNo, Trans::kNo, -1, 2, 2, 1, a.get(), a.get(), 0, a.get()),
              kInvalidArgument);
  EXPECT_CODE(backend_->Gemm(Trans::kNo, Trans::kNo, 2, 2, 2, 1, nullptr, a.get(), 0, a.get()),
              kInvalidArgument);
  EXPECT_CODE(backend_->AddBias(2, 2, a.get(), nullptr, a.get()), kInvalidArgument);
  EXPECT_CODE(backend_->ColumnSum(2, -2, a.get(), false, a.get()), kInvalidArgument);
  EXPECT_CODE(backend_->ActivationForward(static_cast<Activation>(7), 4, a.get(), a.get()),
              kInvalidArgument);
  EXPECT_CODE(backend_->SoftmaxCrossEntropy(2, 0, a.get(), nullptr, 1, nullptr, a.get()),
              kInvalidArgument);
  EXPECT_CODE(backend_->TopKAbs(4, a.get(), 5, nullptr, nullptr), kInvalidArgument);
  EXPECT_CODE(backend_->Im2Col(ConvGeometry{1, 2, 2, 1, 5, 5, 0, 0, 1}, a.get(), a.get()),
              kInvalidArgument);
  EXPECT_CODE(backend_->MaxPoolForward(PoolGeometry{1, 2, 2, 1, 3, 1}, a.get(), a.get(), nullptr),
              kInvalidArgument);
  EXPECT_CODE(backend_->Gemm(Trans::kNo, Trans::kNo, int64_t{1} << 40, int64_t{1} << 40, 1, 1,
                             a.get(), a.get(), 0, a.get()),
              kInvalidArgument);
  EXPECT_EQ(a.Download(), std::vector<float>(4, 1.0f));
}

TEST_F(OpsTest, MemoryRoundTripAndFill) {
  SCOPED_TRACE(Seed());
  auto empty = backend_->Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  std::vector<float> v = RandomFloats(rng_, 100000);
  DeviceArray<float> a(backend_.get(), v), b(backend_.get(), 100000);
  b.Poison();
  ASSERT_TRUE(Run(backend_->CopyOnDevice(a.get(), b.get(), v.size() * 4)).ok());
  EXPECT_EQ(b.Download(), v);
  ASSERT_TRUE(Run(backend_->Fill(99999, -2.5f, b.get())).ok());
  std::vector<float> filled = b.Download();
  EXPECT_EQ(std::vector<float>(filled.begin(), filled.end() - 1), std::vector<float>(99999, -2.5f));
  EXPECT_EQ(filled.back(), v.back());
  auto host = backend_->AllocateHost(4096);
  ASSERT_TRUE(host.ok());
  EXPECT_TRUE(host->on_host());
  EXPECT_NE(host->data(), nullptr);
}

}  // namespace
}  // namespace pscluster::kernels
