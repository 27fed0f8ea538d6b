// Feature interactions (FM, DLRM dot interaction) against float64 references and finite
// differences, the argument checks of every op, and device memory (fixture and conventions as in
// ops_test.cc).
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
