// Every backend op against its float64 reference (kernels/testing/reference_ops.h), with fresh
// random inputs each run and every output poisoned before the op writes it. Built twice: as
// ops_cpu_test (KERNELS_TEST_DEVICE "cpu") and as ops_cuda_test ("cuda", tagged gpu), which
// skips itself where no CUDA device is usable.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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

// ---- Sigmoid cross-entropy ----

// True when every element is the poison value, bit for bit (nothing was written).
bool AllPoison(const std::vector<float>& v) {
  const float poison = PoisonFloat();
  for (const float& f : v) {
    if (std::memcmp(&f, &poison, sizeof(f)) != 0) return false;
  }
  return true;
}

bool HasSubstr(const absl::Status& s, const char* part) {
  return s.message().find(part) != absl::string_view::npos;
}

// INVALID_ARGUMENT whose message names the op and the offending argument.
#define EXPECT_INVALID_NAMING(expr, op, arg)                                   \
  do {                                                                         \
    absl::Status s_ = (expr);                                                  \
    EXPECT_EQ(s_.code(), absl::StatusCode::kInvalidArgument) << s_.ToString(); \
    EXPECT_TRUE(HasSubstr(s_, op) && HasSubstr(s_, arg))                       \
        << s_.ToString() << " does not name " << op << " and " << arg;         \
  } while (0)

std::vector<float> SigmoidLogits(std::mt19937_64& rng, int64_t n, float scale) {
  std::vector<float> z = RandomFloats(rng, n, -scale, scale);
  // Zeros, tiny values, and logits whose exponentials overflow, underflow or turn subnormal.
  const float special[] = {0.0f,   -0.0f,  1e-30f,  -1e-30f, 100.0f, -100.0f, 88.7f,
                           -88.7f, 104.0f, -104.0f, 17.0f,   -17.0f, 1e30f,   -1e30f};
  for (size_t i = 0; i < sizeof(special) / sizeof(special[0]) && i < z.size(); ++i) {
    z[i] = special[i];
  }
  return z;
}

TEST_F(OpsTest, SigmoidCrossEntropyAgainstFloat64) {
  SCOPED_TRACE(Seed());
  for (int64_t rows : {0, 1, 2, 27, 1000, 100003}) {
    for (float scale : {1.0f, 10.0f, 100.0f}) {
      for (bool with_grad : {true, false}) {
        SCOPED_TRACE(absl::StrCat("rows=", rows, " scale=", scale, " grad=", with_grad));
        std::vector<float> logits = SigmoidLogits(rng_, rows, scale);
        std::vector<int32_t> labels = RandomInts(rng_, rows, 0, 2);
        const float grad_scale = rows > 0 ? 1.0f / static_cast<float>(rows) : 1.0f;
        DeviceArray<float> dl(backend_.get(), logits), dg(backend_.get(), rows);
        DeviceArray<float> stats(backend_.get(), 2 * rows);
        DeviceArray<int32_t> dlab(backend_.get(), labels);
        dg.Poison();
        stats.Poison();
        ASSERT_TRUE(Run(backend_->SigmoidCrossEntropy(rows, dl.get(), dlab.get(), grad_scale,
                                                      with_grad ? dg.get() : nullptr, stats.get()))
                        .ok());
        testing::Reference ref_grad, ref_stats;
        testing::RefSigmoidCrossEntropy(logits, labels, grad_scale, &ref_grad, &ref_stats);
        EXPECT_TRUE(WithinBounds(stats.Download(), ref_stats));
        if (with_grad) {
          EXPECT_TRUE(WithinBounds(dg.Download(), ref_grad));
        } else {
          EXPECT_TRUE(AllPoison(dg.Download()));
        }
        EXPECT_EQ(dl.Download(), logits);  // The input is left alone.
      }
    }
  }
}

TEST_F(OpsTest, SigmoidCrossEntropyIsStableForLargeLogits) {
  const std::vector<float> logits = {100.0f, 100.0f, -100.0f, -100.0f, 1e4f, 1e4f, -1e4f, -1e4f};
  const std::vector<int32_t> labels = {1, 0, 1, 0, 1, 0, 1, 0};
  const int64_t rows = logits.size();
  const float grad_scale = 0.5f;
  DeviceArray<float> dl(backend_.get(), logits), dg(backend_.get(), rows);
  DeviceArray<float> stats(backend_.get(), 2 * rows);
  DeviceArray<int32_t> dlab(backend_.get(), labels);
  dg.Poison();
  stats.Poison();
  ASSERT_TRUE(Run(backend_->SigmoidCrossEntropy(rows, dl.get(), dlab.get(), grad_scale, dg.get(),
                                                stats.get()))
                  .ok());
  const std::vector<float> s = stats.Download(), g = dg.Download();
  for (int64_t i = 0; i < rows; ++i) {
    SCOPED_TRACE(absl::StrCat("z=", logits[i], " y=", labels[i]));
    const float loss = s[2 * i], correct = s[2 * i + 1];
    ASSERT_TRUE(std::isfinite(loss)) << loss;
    ASSERT_TRUE(std::isfinite(g[i])) << g[i];
    // The gradient pushes the logit towards the label: never positive for y = 1, never
    // negative for y = 0.
    if (labels[i] == 1) {
      EXPECT_LE(g[i], 0.0f);
    } else {
      EXPECT_GE(g[i], 0.0f);
    }
    if ((logits[i] > 0) == (labels[i] == 1)) {  // Confidently right: no loss, no gradient.
      EXPECT_GE(loss, 0.0f);
      EXPECT_LE(loss, 1e-30f);
      EXPECT_LE(std::fabs(g[i]), 1e-30f);
      EXPECT_EQ(correct, 1.0f);
    } else {  // Confidently wrong: loss |z|, the whole gradient.
      EXPECT_FLOAT_EQ(loss, std::fabs(logits[i]));
      EXPECT_FLOAT_EQ(g[i], labels[i] == 1 ? -grad_scale : grad_scale);
      EXPECT_EQ(correct, 0.0f);
    }
  }
}

TEST_F(OpsTest, SigmoidCrossEntropyNaNLogitGivesNaNLoss) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = {nan, nan, 1.5f, -0.25f};
  const std::vector<int32_t> labels = {1, 0, 1, 0};
  DeviceArray<float> dl(backend_.get(), logits), dg(backend_.get(), 4), stats(backend_.get(), 8);
  DeviceArray<int32_t> dlab(backend_.get(), labels);
  ASSERT_TRUE(
      Run(backend_->SigmoidCrossEntropy(4, dl.get(), dlab.get(), 1.0f, dg.get(), stats.get()))
          .ok());
  const std::vector<float> s = stats.Download(), g = dg.Download();
  EXPECT_TRUE(std::isnan(s[0])) << s[0];
  EXPECT_TRUE(std::isnan(s[2])) << s[2];
  EXPECT_TRUE(std::isnan(g[0])) << g[0];
  EXPECT_TRUE(std::isnan(g[1])) << g[1];
  // backend.h: a NaN logit predicts 0 ((z > 0) is false). Against label 1 that is wrong; against
  // label 0 it counts as right.
  EXPECT_EQ(s[1], 0.0f);
  EXPECT_EQ(s[3], 1.0f);
  // The NaN rows do not spill into the others.
  EXPECT_TRUE(std::isfinite(s[4]) && std::isfinite(s[6]));
  EXPECT_EQ(s[5], 1.0f);
  EXPECT_EQ(s[7], 1.0f);
  EXPECT_TRUE(std::isfinite(g[2]) && std::isfinite(g[3]));
}

TEST_F(OpsTest, SigmoidCrossEntropyGradientMayOverwriteLogits) {
  SCOPED_TRACE(Seed());
  for (int64_t rows : {1, 40, 50000}) {
    std::vector<float> logits = SigmoidLogits(rng_, rows, 8.0f);
    std::vector<int32_t> labels = RandomInts(rng_, rows, 0, 2);
    DeviceArray<float> dl(backend_.get(), logits), stats(backend_.get(), 2 * rows);
    DeviceArray<int32_t> dlab(backend_.get(), labels);
    ASSERT_TRUE(
        Run(backend_->SigmoidCrossEntropy(rows, dl.get(), dlab.get(), 0.25f, dl.get(), stats.get()))
            .ok());
    testing::Reference ref_grad, ref_stats;
    testing::RefSigmoidCrossEntropy(logits, labels, 0.25f, &ref_grad, &ref_stats);
    EXPECT_TRUE(WithinBounds(dl.Download(), ref_grad)) << "rows=" << rows;
    EXPECT_TRUE(WithinBounds(stats.Download(), ref_stats)) << "rows=" << rows;
  }
}

TEST_F(OpsTest, SigmoidCrossEntropyGradientMatchesFiniteDifferences) {
  SCOPED_TRACE(Seed());
  // Each row's loss depends on its own logit only, so one pair of forward passes with every
  // logit moved differentiates all rows at once.
  const int64_t rows = 500;
  const float h = 1.0f / 32;
  std::vector<float> z = RandomFloats(rng_, rows, -4.0f, 4.0f);
  z[0] = 0.0f;
  std::vector<int32_t> labels = RandomInts(rng_, rows, 0, 2);
  std::vector<float> zp(rows), zm(rows);
  for (int64_t i = 0; i < rows; ++i) {
    zp[i] = z[i] + h;
    zm[i] = z[i] - h;
  }
  DeviceArray<float> dz(backend_.get(), z), dzp(backend_.get(), zp), dzm(backend_.get(), zm);
  DeviceArray<int32_t> dlab(backend_.get(), labels);
  DeviceArray<float> g(backend_.get(), rows), sp(backend_.get(), 2 * rows),
      sm(backend_.get(), 2 * rows), s(backend_.get(), 2 * rows);
  ASSERT_TRUE(
      Run(backend_->SigmoidCrossEntropy(rows, dz.get(), dlab.get(), 1.0f, g.get(), s.get())).ok());
  ASSERT_TRUE(
      Run(backend_->SigmoidCrossEntropy(rows, dzp.get(), dlab.get(), 1.0f, nullptr, sp.get()))
          .ok());
  ASSERT_TRUE(
      Run(backend_->SigmoidCrossEntropy(rows, dzm.get(), dlab.get(), 1.0f, nullptr, sm.get()))
          .ok());
  const std::vector<float> grad = g.Download(), lp = sp.Download(), lm = sm.Download();
  for (int64_t i = 0; i < rows; ++i) {
    const double fd =
        (static_cast<double>(lp[2 * i]) - lm[2 * i]) / (static_cast<double>(zp[i]) - zm[i]);
    EXPECT_NEAR(grad[i], fd, 1e-3 * (std::fabs(fd) + 0.1)) << "z=" << z[i] << " y=" << labels[i];
  }
}

TEST_F(OpsTest, SigmoidCrossEntropyRejectsBadLabels) {
  const std::vector<float> logits = {0.5f, -2.0f, 3.0f};
  for (int32_t bad :
       {-1, 2, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()}) {
    SCOPED_TRACE(absl::StrCat("bad label ", bad));
    DeviceArray<float> dl(backend_.get(), logits), dg(backend_.get(), 3), stats(backend_.get(), 6);
    DeviceArray<int32_t> labels(backend_.get(), std::vector<int32_t>{1, bad, 0});
    dg.Poison();
    stats.Poison();
    absl::Status s =
        Run(backend_->SigmoidCrossEntropy(3, dl.get(), labels.get(), 1.0f, dg.get(), stats.get()));
    EXPECT_INVALID_NAMING(s, "SigmoidCrossEntropy", "label");
    // Gradient in place over the logits.
    s = Run(backend_->SigmoidCrossEntropy(3, dl.get(), labels.get(), 1.0f, dl.get(), stats.get()));
    EXPECT_CODE(s, kInvalidArgument);
    if (backend_->kind() == DeviceKind::kCpu) {
      // The CPU backend checks every label before it writes: nothing changed.
      EXPECT_TRUE(AllPoison(dg.Download()));
      EXPECT_TRUE(AllPoison(stats.Download()));
      EXPECT_EQ(dl.Download(), logits);
    }
  }
  // The backend is usable afterwards.
  DeviceArray<float> dl(backend_.get(), logits), stats(backend_.get(), 6);
  DeviceArray<int32_t> labels(backend_.get(), std::vector<int32_t>{0, 1, 1});
  EXPECT_TRUE(
      Run(backend_->SigmoidCrossEntropy(3, dl.get(), labels.get(), 1.0f, nullptr, stats.get()))
          .ok());
  EXPECT_EQ(stats.Download()[3], 0.0f);  // z = -2 against label 1.
}

// ---- Block copies ----

TEST_F(OpsTest, CopyBlockWithStridesAndAccumulation) {
  SCOPED_TRACE(Seed());
  struct Case {
    int64_t rows, cols, src_stride, dst_stride;
  };
  const Case cases[] = {{0, 5, 5, 7},        {3, 0, 2, 2},     {1, 1, 1, 1},    {1, 16, 16, 16},
                        {4, 1, 3, 5},        {37, 16, 16, 16}, {50, 7, 19, 11}, {2, 9, 9, 30},
                        {1000, 33, 40, 100}, {3000, 5, 5, 13}, {20000, 1, 1, 2}};
  for (const Case& c : cases) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(absl::StrCat(c.rows, "x", c.cols, " strides ", c.src_stride, "/", c.dst_stride,
                                " accumulate=", accumulate));
      // The block starts inside each buffer (a column slice), and dst has two spare floats at
      // the end: everything outside the block must be left exactly as it was.
      const int64_t src_off = (c.src_stride - c.cols) / 2;
      const int64_t dst_off = (c.dst_stride - c.cols) / 2 + 1;
      std::vector<float> src = RandomFloats(rng_, src_off + c.rows * c.src_stride, -4, 4);
      std::vector<float> dst = RandomFloats(rng_, dst_off + c.rows * c.dst_stride + 2, -4, 4);
      if (!accumulate) {  // The old block must not be read: poison it.
        for (int64_t i = 0; i < c.rows; ++i) {
          for (int64_t j = 0; j < c.cols; ++j) {
            dst[dst_off + i * c.dst_stride + j] = PoisonFloat();
          }
        }
      }
      DeviceArray<float> ds(backend_.get(), src), dd(backend_.get(), dst);
      const float* src_ptr = src.empty() ? nullptr : ds.get() + src_off;
      ASSERT_TRUE(Run(backend_->CopyBlock(c.rows, c.cols, src_ptr, c.src_stride, dd.get() + dst_off,
                                          c.dst_stride, accumulate))
                      .ok());
      const testing::Reference tail = testing::RefCopyBlock(
          c.rows, c.cols, std::vector<float>(src.begin() + src_off, src.end()), c.src_stride,
          std::vector<float>(dst.begin() + dst_off, dst.end()), c.dst_stride, accumulate);
      testing::Reference want;
      want.value.assign(dst.begin(), dst.begin() + dst_off);
      want.bound.assign(dst_off, 0.0);
      want.value.insert(want.value.end(), tail.value.begin(), tail.value.end());
      want.bound.insert(want.bound.end(), tail.bound.begin(), tail.bound.end());
      EXPECT_TRUE(WithinBounds(dd.Download(), want));
      EXPECT_EQ(ds.Download(), src);
    }
  }
}

TEST_F(OpsTest, CopyBlockConcatenatesAndSplitsColumns) {
  // [a | b] built from a [rows, 3] and b [rows, 5], then split back, then b's gradient summed
  // into an existing one: the layouts a concatenation layer uses.
  const int64_t rows = 4;
  std::vector<float> a(rows * 3), b(rows * 5);
  for (int64_t i = 0; i < rows * 3; ++i) a[i] = static_cast<float>(i);
  for (int64_t i = 0; i < rows * 5; ++i) b[i] = static_cast<float>(100 + i);
  DeviceArray<float> da(backend_.get(), a), db(backend_.get(), b), cat(backend_.get(), rows * 8);
  cat.Poison();
  ASSERT_TRUE(Run(backend_->CopyBlock(rows, 3, da.get(), 3, cat.get(), 8, false)).ok());
  ASSERT_TRUE(Run(backend_->CopyBlock(rows, 5, db.get(), 5, cat.get() + 3, 8, false)).ok());
  std::vector<float> want;
  for (int64_t i = 0; i < rows; ++i) {
    want.insert(want.end(), a.begin() + i * 3, a.begin() + (i + 1) * 3);
    want.insert(want.end(), b.begin() + i * 5, b.begin() + (i + 1) * 5);
  }
  EXPECT_EQ(cat.Download(), want);
  DeviceArray<float> back(backend_.get(), rows * 5);
  back.Poison();
  ASSERT_TRUE(Run(backend_->CopyBlock(rows, 5, cat.get() + 3, 8, back.get(), 5, false)).ok());
  EXPECT_EQ(back.Download(), b);
  ASSERT_TRUE(Run(backend_->CopyBlock(rows, 5, cat.get() + 3, 8, back.get(), 5, true)).ok());
  std::vector<float> twice = b;
  for (float& v : twice) v *= 2;
  EXPECT_EQ(back.Download(), twice);
}

TEST_F(OpsTest, CopyBlockRejectsBadArguments) {
  const std::vector<float> init = {1, 2, 3, 4, 5, 6, 7, 8};
  DeviceArray<float> a(backend_.get(), init), b(backend_.get(), init);
  const char* op = "CopyBlock";
  EXPECT_INVALID_NAMING(backend_->CopyBlock(2, 3, a.get(), 2, b.get(), 4, false), op, "src_stride");
  EXPECT_INVALID_NAMING(backend_->CopyBlock(2, 3, a.get(), 4, b.get(), 2, true), op, "dst_stride");
  EXPECT_INVALID_NAMING(backend_->CopyBlock(-1, 2, a.get(), 2, b.get(), 2, false), op, "rows");
  EXPECT_INVALID_NAMING(backend_->CopyBlock(2, -2, a.get(), 2, b.get(), 2, false), op, "cols");
  EXPECT_INVALID_NAMING(backend_->CopyBlock(2, 0, a.get(), -1, b.get(), 2, false), op,
                        "src_stride");
  EXPECT_INVALID_NAMING(backend_->CopyBlock(2, 0, a.get(), 1, b.get(), -4, false), op,
                        "dst_stride");
  EXPECT_INVALID_NAMING(backend_->CopyBlock(2, 2, nullptr, 4, b.get(), 4, false), op, "src");
  EXPECT_INVALID_NAMING(backend_->CopyBlock(2, 2, a.get(), 4, nullptr, 4, false), op, "dst");
  // Overlapping source and destination, in place or shifted.
  EXPECT_INVALID_NAMING(backend_->CopyBlock(2, 2, a.get(), 4, a.get(), 4, true), op, "overlap");
  EXPECT_INVALID_NAMING(backend_->CopyBlock(2, 2, a.get(), 4, a.get() + 1, 4, false), op,
                        "overlap");
  EXPECT_INVALID_NAMING(backend_->CopyBlock(1, 4, a.get() + 2, 4, a.get(), 4, false), op,
                        "overlap");
  EXPECT_EQ(a.Download(), init);
  EXPECT_EQ(b.Download(), init);
  // Empty blocks need no memory.
  EXPECT_TRUE(Run(backend_->CopyBlock(0, 3, nullptr, 3, nullptr, 3, false)).ok());
  EXPECT_TRUE(Run(backend_->CopyBlock(3, 0, nullptr, 0, nullptr, 0, true)).ok());
  // Adjacent but disjoint ranges are fine.
  EXPECT_TRUE(Run(backend_->CopyBlock(1, 4, a.get(), 4, a.get() + 4, 4, false)).ok());
  EXPECT_EQ(a.Download(), std::vector<float>({1, 2, 3, 4, 1, 2, 3, 4}));
}

// ---- Sparse rows ----

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

// ---- Feature interactions ----

struct InteractionShape {
  int64_t rows, vectors, width;
};

std::string ShapeName(const InteractionShape& s) {
  return absl::StrCat("rows=", s.rows, " vectors=", s.vectors, " width=", s.width);
}

int64_t Pairs(int64_t vectors) { return vectors * (vectors - 1) / 2; }

std::vector<InteractionShape> InteractionShapes() {
  std::vector<InteractionShape> shapes;
  for (int64_t rows : {0, 1, 5, 64}) {
    for (int64_t vectors : {1, 2, 27}) {
      for (int64_t width : {1, 16}) shapes.push_back({rows, vectors, width});
    }
  }
  // Widths that are not a multiple of anything, more vectors than a warp, many rows.
  shapes.push_back({3, 5, 3});
  shapes.push_back({2, 40, 33});
  shapes.push_back({3000, 4, 8});
  shapes.push_back({7, 3, 100});
  return shapes;
}

TEST_F(OpsTest, FmForwardAndBackwardAgainstFloat64) {
  SCOPED_TRACE(Seed());
  for (const InteractionShape& s : InteractionShapes()) {
    SCOPED_TRACE(ShapeName(s));
    const int64_t size = s.rows * s.vectors * s.width;
    std::vector<float> x = RandomFloats(rng_, size, -2, 2);
    std::vector<float> dout = RandomFloats(rng_, s.rows, -2, 2);
    DeviceArray<float> dx_in(backend_.get(), x), out(backend_.get(), s.rows);
    DeviceArray<float> ddout(backend_.get(), dout), dx(backend_.get(), size);
    out.Poison();
    dx.Poison();
    ASSERT_TRUE(Run(backend_->FmForward(s.rows, s.vectors, s.width, dx_in.get(), out.get())).ok());
    EXPECT_TRUE(WithinBounds(out.Download(), testing::RefFmForward(s.rows, s.vectors, s.width, x)));
    ASSERT_TRUE(
        Run(backend_->FmBackward(s.rows, s.vectors, s.width, dx_in.get(), ddout.get(), dx.get()))
            .ok());
    EXPECT_TRUE(
        WithinBounds(dx.Download(), testing::RefFmBackward(s.rows, s.vectors, s.width, x, dout)));
    EXPECT_EQ(dx_in.Download(), x);
  }
}

TEST_F(OpsTest, DotInteractionForwardAndBackwardAgainstFloat64) {
  SCOPED_TRACE(Seed());
  for (const InteractionShape& s : InteractionShapes()) {
    SCOPED_TRACE(ShapeName(s));
    const int64_t size = s.rows * s.vectors * s.width;
    const int64_t out_size = s.rows * Pairs(s.vectors);
    std::vector<float> x = RandomFloats(rng_, size, -2, 2);
    std::vector<float> dout = RandomFloats(rng_, out_size, -2, 2);
    DeviceArray<float> dx_in(backend_.get(), x), out(backend_.get(), out_size);
    DeviceArray<float> ddout(backend_.get(), dout), dx(backend_.get(), size);
    out.Poison();
    dx.Poison();
    ASSERT_TRUE(
        Run(backend_->DotInteractionForward(s.rows, s.vectors, s.width, dx_in.get(), out.get()))
            .ok());
    EXPECT_TRUE(WithinBounds(out.Download(),
                             testing::RefDotInteractionForward(s.rows, s.vectors, s.width, x)));
    ASSERT_TRUE(Run(backend_->DotInteractionBackward(s.rows, s.vectors, s.width, dx_in.get(),
                                                     ddout.get(), dx.get()))
                    .ok());
    EXPECT_TRUE(WithinBounds(
        dx.Download(), testing::RefDotInteractionBackward(s.rows, s.vectors, s.width, x, dout)));
    EXPECT_EQ(dx_in.Download(), x);
  }
}

TEST_F(OpsTest, DotInteractionPairOrder) {
  // Distinct primes, so every product names its pair. backend.h: p = a (a - 1) / 2 + b for
  // a > b, i.e. (1,0), (2,0), (2,1), (3,0), (3,1), (3,2), (4,0), ...
  const int64_t rows = 2, vectors = 5, width = 1;
  const std::vector<float> x = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29};
  const std::pair<int, int> order[] = {{1, 0}, {2, 0}, {2, 1}, {3, 0}, {3, 1},
                                       {3, 2}, {4, 0}, {4, 1}, {4, 2}, {4, 3}};
  const int64_t pairs = Pairs(vectors);
  ASSERT_EQ(pairs, 10);
  std::vector<float> want;
  for (int64_t r = 0; r < rows; ++r) {
    for (auto [a, b] : order) want.push_back(x[r * vectors + a] * x[r * vectors + b]);
  }
  DeviceArray<float> dx_in(backend_.get(), x), out(backend_.get(), rows * pairs);
  out.Poison();
  ASSERT_TRUE(
      Run(backend_->DotInteractionForward(rows, vectors, width, dx_in.get(), out.get())).ok());
  EXPECT_EQ(out.Download(), want);
  // Backward with a one-hot dout at pair p = (a, b) of row 1: dx[1,a] = x[1,b], dx[1,b] = x[1,a],
  // everything else 0.
  DeviceArray<float> dx(backend_.get(), rows * vectors);
  for (int64_t p = 0; p < pairs; ++p) {
    const auto [a, b] = order[p];
    std::vector<float> dout(rows * pairs, 0.0f);
    dout[pairs + p] = 1.0f;
    DeviceArray<float> ddout(backend_.get(), dout);
    dx.Poison();
    ASSERT_TRUE(Run(backend_->DotInteractionBackward(rows, vectors, width, dx_in.get(), ddout.get(),
                                                     dx.get()))
                    .ok());
    std::vector<float> want_dx(rows * vectors, 0.0f);
    want_dx[vectors + a] = x[vectors + b];
    want_dx[vectors + b] = x[vectors + a];
    EXPECT_EQ(dx.Download(), want_dx) << "pair " << p << " = (" << a << ", " << b << ")";
  }
}

// dx from `backward` against central differences of sum_j dout[j] * out[j], with `forward`
// producing out [rows, outputs_per_row] from x [rows, vectors, width]. Both ops are linear in
// each single element of x, so the differences are exact but for rounding, and a wide step
// keeps that small. Element (a, k) is moved in every row at once (rows are independent).
template <typename Forward, typename Backward>
void ExpectMatchesFiniteDifferences(Backend* backend, std::mt19937_64& rng,
                                    const InteractionShape& s, int64_t outputs_per_row,
                                    Forward forward, Backward backward) {
  const int64_t size = s.rows * s.vectors * s.width;
  const int64_t out_size = s.rows * outputs_per_row;
  const std::vector<float> x = RandomFloats(rng, size, -1, 1);
  const std::vector<float> dout = RandomFloats(rng, out_size, -1, 1);
  DeviceArray<float> dx_in(backend, x), ddout(backend, dout), dx(backend, size);
  DeviceArray<float> moved(backend, size), out(backend, out_size);
  dx.Poison();
  ASSERT_TRUE(backward(dx_in.get(), ddout.get(), dx.get()).ok());
  ASSERT_TRUE(backend->Synchronize().ok());
  const std::vector<float> grad = dx.Download();
  const float h = 0.5f;
  int failures = 0;
  for (int64_t a = 0; a < s.vectors; ++a) {
    for (int64_t k = 0; k < s.width; ++k) {
      std::vector<float> xp = x, xm = x;
      for (int64_t r = 0; r < s.rows; ++r) {
        const int64_t e = (r * s.vectors + a) * s.width + k;
        xp[e] = x[e] + h;
        xm[e] = x[e] - h;
      }
      moved.Upload(xp);
      ASSERT_TRUE(forward(moved.get(), out.get()).ok());
      const std::vector<float> op = out.Download();
      moved.Upload(xm);
      ASSERT_TRUE(forward(moved.get(), out.get()).ok());
      const std::vector<float> om = out.Download();
      for (int64_t r = 0; r < s.rows; ++r) {
        double diff = 0;
        for (int64_t j = 0; j < outputs_per_row; ++j) {
          const int64_t o = r * outputs_per_row + j;
          diff += static_cast<double>(dout[o]) * (static_cast<double>(op[o]) - om[o]);
        }
        const int64_t e = (r * s.vectors + a) * s.width + k;
        const double fd = diff / (static_cast<double>(xp[e]) - xm[e]);
        if (!(std::fabs(grad[e] - fd) <= 1e-3 * (std::fabs(fd) + 1.0)) && ++failures <= 5) {
          ADD_FAILURE() << "dx[" << r << "," << a << "," << k << "] = " << grad[e]
                        << ", finite difference " << fd;
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST_F(OpsTest, InteractionBackwardsMatchFiniteDifferences) {
  SCOPED_TRACE(Seed());
  for (int64_t rows : {1, 3}) {
    for (int64_t vectors : {1, 2, 27}) {
      for (int64_t width : {1, 16}) {
        const InteractionShape s{rows, vectors, width};
        SCOPED_TRACE(ShapeName(s));
        Backend* b = backend_.get();
        {
          SCOPED_TRACE("FM");
          ExpectMatchesFiniteDifferences(
              b, rng_, s, 1,
              [&](const float* x, float* out) {
                return b->FmForward(rows, vectors, width, x, out);
              },
              [&](const float* x, const float* dout, float* dx) {
                return b->FmBackward(rows, vectors, width, x, dout, dx);
              });
        }
        {
          SCOPED_TRACE("dot interaction");
          ExpectMatchesFiniteDifferences(
              b, rng_, s, Pairs(vectors),
              [&](const float* x, float* out) {
                return b->DotInteractionForward(rows, vectors, width, x, out);
              },
              [&](const float* x, const float* dout, float* dx) {
                return b->DotInteractionBackward(rows, vectors, width, x, dout, dx);
              });
        }
      }
    }
  }
}

TEST_F(OpsTest, InteractionsWithNoVectorsOrNoWidth) {
  DeviceArray<float> out(backend_.get(), 6), dx(backend_.get(), 6);
  // No vectors or zero width: every FM term and dot product is an empty sum.
  out.Poison();
  ASSERT_TRUE(Run(backend_->FmForward(3, 0, 4, nullptr, out.get())).ok());
  std::vector<float> got = out.Download();
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 3), std::vector<float>(3, 0.0f));
  EXPECT_TRUE(AllPoison(std::vector<float>(got.begin() + 3, got.end())));
  out.Poison();
  ASSERT_TRUE(Run(backend_->FmForward(3, 2, 0, nullptr, out.get())).ok());
  got = out.Download();
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 3), std::vector<float>(3, 0.0f));
  ASSERT_TRUE(Run(backend_->FmBackward(3, 0, 4, nullptr, nullptr, nullptr)).ok());
  ASSERT_TRUE(Run(backend_->FmBackward(3, 2, 0, nullptr, nullptr, nullptr)).ok());
  out.Poison();
  ASSERT_TRUE(Run(backend_->DotInteractionForward(2, 3, 0, nullptr, out.get())).ok());
  EXPECT_EQ(out.Download(), std::vector<float>(6, 0.0f));
  // One vector: no pairs, so no output, and a zero gradient.
  ASSERT_TRUE(Run(backend_->DotInteractionForward(4, 1, 3, nullptr, nullptr)).ok());
  DeviceArray<float> x(backend_.get(), std::vector<float>{1, 2, 3, 4, 5, 6});
  dx.Poison();
  ASSERT_TRUE(Run(backend_->DotInteractionBackward(2, 1, 3, x.get(), nullptr, dx.get())).ok());
  EXPECT_EQ(dx.Download(), std::vector<float>(6, 0.0f));
  ASSERT_TRUE(Run(backend_->DotInteractionBackward(2, 0, 3, nullptr, nullptr, nullptr)).ok());
  // One vector in the FM: no pairs either.
  out.Poison();
  ASSERT_TRUE(Run(backend_->FmForward(2, 1, 3, x.get(), out.get())).ok());
  got = out.Download();
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 2), std::vector<float>(2, 0.0f));
}

TEST_F(OpsTest, NewOpsRejectInvalidArgumentsNamingThem) {
  const std::vector<float> init(8, 1.0f);
  DeviceArray<float> a(backend_.get(), init), b(backend_.get(), init);
  DeviceArray<int32_t> labels(backend_.get(), std::vector<int32_t>(8, 0));
  const char* sce = "SigmoidCrossEntropy";
  EXPECT_INVALID_NAMING(
      backend_->SigmoidCrossEntropy(-1, a.get(), labels.get(), 1, nullptr, b.get()), sce, "rows");
  EXPECT_INVALID_NAMING(
      backend_->SigmoidCrossEntropy(2, nullptr, labels.get(), 1, nullptr, b.get()), sce, "logits");
  EXPECT_INVALID_NAMING(backend_->SigmoidCrossEntropy(2, a.get(), nullptr, 1, nullptr, b.get()),
                        sce, "labels");
  EXPECT_INVALID_NAMING(
      backend_->SigmoidCrossEntropy(2, a.get(), labels.get(), 1, a.get(), nullptr), sce,
      "row_stats");

  const char* fmf = "FmForward";
  EXPECT_INVALID_NAMING(backend_->FmForward(-1, 2, 2, a.get(), b.get()), fmf, "rows");
  EXPECT_INVALID_NAMING(backend_->FmForward(1, -2, 2, a.get(), b.get()), fmf, "vectors");
  EXPECT_INVALID_NAMING(backend_->FmForward(1, 2, -2, a.get(), b.get()), fmf, "width");
  EXPECT_INVALID_NAMING(backend_->FmForward(1, 2, 2, nullptr, b.get()), fmf, "x");
  EXPECT_INVALID_NAMING(backend_->FmForward(1, 2, 2, a.get(), nullptr), fmf, "out");
  const char* fmb = "FmBackward";
  EXPECT_INVALID_NAMING(backend_->FmBackward(-3, 2, 2, a.get(), a.get(), b.get()), fmb, "rows");
  EXPECT_INVALID_NAMING(backend_->FmBackward(1, 2, 2, nullptr, a.get(), b.get()), fmb, "x");
  EXPECT_INVALID_NAMING(backend_->FmBackward(1, 2, 2, a.get(), nullptr, b.get()), fmb, "dout");
  EXPECT_INVALID_NAMING(backend_->FmBackward(1, 2, 2, a.get(), a.get(), nullptr), fmb, "dx");

  const char* dif = "DotInteractionForward";
  EXPECT_INVALID_NAMING(backend_->DotInteractionForward(2, -1, 2, a.get(), b.get()), dif,
                        "vectors");
  EXPECT_INVALID_NAMING(backend_->DotInteractionForward(2, 2, -1, a.get(), b.get()), dif, "width");
  EXPECT_INVALID_NAMING(backend_->DotInteractionForward(0, int64_t{1} << 31, 1, a.get(), b.get()),
                        dif, "vectors");
  EXPECT_INVALID_NAMING(backend_->DotInteractionForward(2, 2, 2, nullptr, b.get()), dif, "x");
  EXPECT_INVALID_NAMING(backend_->DotInteractionForward(2, 2, 2, a.get(), nullptr), dif, "out");
  const char* dib = "DotInteractionBackward";
  EXPECT_INVALID_NAMING(backend_->DotInteractionBackward(-2, 2, 2, a.get(), a.get(), b.get()), dib,
                        "rows");
  EXPECT_INVALID_NAMING(backend_->DotInteractionBackward(2, 2, 2, nullptr, a.get(), b.get()), dib,
                        "x");
  EXPECT_INVALID_NAMING(backend_->DotInteractionBackward(2, 2, 2, a.get(), nullptr, b.get()), dib,
                        "dout");
  EXPECT_INVALID_NAMING(backend_->DotInteractionBackward(2, 2, 2, a.get(), a.get(), nullptr), dib,
                        "dx");
  // Sizes whose product overflows.
  EXPECT_INVALID_NAMING(
      backend_->FmForward(int64_t{1} << 40, int64_t{1} << 20, 1 << 20, a.get(), b.get()), fmf,
      "too large");
  EXPECT_INVALID_NAMING(
      backend_->DotInteractionForward(int64_t{1} << 20, int64_t{1} << 30, 1, a.get(), b.get()), dif,
      "too large");
  EXPECT_EQ(a.Download(), init);
  EXPECT_EQ(b.Download(), init);
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
