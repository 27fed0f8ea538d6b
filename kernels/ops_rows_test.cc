// Backend ops on rows and blocks against their float64 references: block copies, gather and
// scatter-add, embedding bags, half casts, top-k, im2col and max pooling (fixture and conventions
// as in ops_test.cc).
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

}  // namespace
}  // namespace pscluster::kernels
