// Every backend op against its float64 reference (kernels/testing/reference_ops.h), with fresh
// random inputs each run and every output poisoned before the op writes it. Built twice: as
// ops_cpu_test (KERNELS_TEST_DEVICE "cpu") and as ops_cuda_test ("cuda", tagged gpu), which
// skips itself where no CUDA device is usable. The tests of row and block ops are in
// ops_rows_test.cc, of interactions and argument checks in ops_interaction_test.cc; the fixture in
// ops_test_fixture.h.
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
#include "common/half_bits.h"
#include "kernels/ops_test_fixture.h"
#include "kernels/testing/reference_ops.h"
#include "kernels/testing/test_util.h"

namespace pscluster::kernels {
namespace {

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

}  // namespace
}  // namespace pscluster::kernels
