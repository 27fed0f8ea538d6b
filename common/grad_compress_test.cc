#include "common/grad_compress.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "common/codec_simd.h"
#include "common/compression_spec.h"
#include "common/half_bits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(TopKCountTest, RoundsUpAndSendsAtLeastOne) {
  EXPECT_EQ(TopKCount(1000, 0.01f), 10u);
  EXPECT_EQ(TopKCount(1001, 0.01f), 11u);
  EXPECT_EQ(TopKCount(10, 0.01f), 1u);
  EXPECT_EQ(TopKCount(1, 0.5f), 1u);
  EXPECT_EQ(TopKCount(0, 0.5f), 0u);
  EXPECT_EQ(TopKCount(5, 0.2f), 1u);  // 0.2f is a little above 0.2.
  EXPECT_EQ(TopKCount(65536, 0.01f), 656u);
}

TEST(SelectTopKTest, PicksTheLargestMagnitudesInIndexOrder) {
  const float x[] = {0.1f, -5.f, 2.f, 0.f, -3.f, 4.f};
  EXPECT_THAT(SelectTopK(x, 6, 3), ElementsAre(1, 4, 5));
  EXPECT_THAT(SelectTopK(x, 6, 6), ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(SelectTopKTest, TiesGoToTheLowerIndex) {
  const float x[] = {1.f, -1.f, 1.f, 1.f};
  EXPECT_THAT(SelectTopK(x, 4, 2), ElementsAre(0, 1));
}

TEST(SelectTopKTest, MatchesSortingOnRandomData) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  std::vector<float> x(5000);
  for (float& v : x) v = d(rng);
  const auto got = SelectTopK(x.data(), x.size(), 50);
  std::vector<float> mags;
  for (float v : x) mags.push_back(std::fabs(v));
  std::sort(mags.rbegin(), mags.rend());
  ASSERT_EQ(got.size(), 50u);
  for (uint32_t i : got) EXPECT_GE(std::fabs(x[i]), mags[49]);
}

// The selection by sorting indices (what SelectTopK did before it selected over the keys).
std::vector<uint32_t> SelectTopKBySortingIndices(const float* x, uint64_t n, uint64_t k) {
  std::vector<uint32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0u);
  std::sort(idx.begin(), idx.end(), [x](uint32_t a, uint32_t b) {
    const uint32_t ka = AbsKey(x[a]), kb = AbsKey(x[b]);
    return ka != kb ? ka > kb : a < b;
  });
  idx.resize(std::min(n, k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

// Many ties (values from a small set, both signs), zeros of both signs, infinities and NaNs.
TEST(SelectTopKTest, MatchesTheFullOrderOnTiesAndSpecialValues) {
  std::mt19937 rng(23);
  for (uint64_t n : {1, 2, 7, 100, 1000, 65536}) {
    std::vector<float> x(n);
    for (int mode = 0; mode < 3; ++mode) {
      for (uint64_t i = 0; i < n; ++i) {
        const uint32_t r = rng();
        if (mode == 0) {
          x[i] = std::ldexp(static_cast<float>(r % 5), -2) * ((r & 8) ? -1.f : 1.f);
        } else if (mode == 1) {
          const float special[] = {0.f, -0.f, INFINITY, -INFINITY, NAN, -NAN, 1.f, -1.f};
          x[i] = special[r % 8];
        } else {
          x[i] = std::normal_distribution<float>()(rng);
        }
      }
      for (uint64_t k : {uint64_t{0}, uint64_t{1}, n / 100, n / 3, n - 1, n}) {
        if (k > n) continue;
        ASSERT_EQ(SelectTopK(x.data(), n, k), SelectTopKBySortingIndices(x.data(), n, k))
            << "n=" << n << " k=" << k << " mode=" << mode;
      }
    }
  }
}

// Large blocks with few elements taken: the sampled threshold's path, whose answer must be the
// radix select's and the full order's, for data it guesses well (smooth), data it guesses badly
// (the large values bunched where the sample does not look, so it falls back), ties at the
// threshold, zeros and special values.
TEST(SelectTopKTest, TheSampledPathGivesTheSameIndicesAsTheFullOrder) {
  std::mt19937 rng(41);
  for (uint64_t n : {uint64_t{16384}, uint64_t{65536}, uint64_t{535818}}) {
    std::vector<float> x(n);
    for (int mode = 0; mode < 5; ++mode) {
      for (uint64_t i = 0; i < n; ++i) {
        const uint32_t r = rng();
        switch (mode) {
          case 0:  // Smooth.
            x[i] = std::normal_distribution<float>()(rng);
            break;
          case 1:  // Few distinct magnitudes: ties across the threshold.
            x[i] = std::ldexp(static_cast<float>(r % 7), -3) * ((r & 8) ? -1.f : 1.f);
            break;
          case 2:  // Large values only between the sample's points.
            x[i] = (i % 97 == 13) ? 100.f + (r % 1000) : 1e-3f * (r % 10);
            break;
          case 3:  // Mostly zero.
            x[i] = (r % 500 == 0) ? static_cast<float>(r % 100) : ((r & 1) ? 0.f : -0.f);
            break;
          default: {  // Special values now and then.
            const float special[] = {INFINITY, -INFINITY, NAN, -NAN};
            x[i] = (r % 1000 == 0) ? special[(r >> 10) % 4]
                                   : std::normal_distribution<float>()(rng);
          }
        }
      }
      for (uint64_t k : {uint64_t{1}, n / 1000, n / 100, n / 20}) {
        const auto want = SelectTopKBySortingIndices(x.data(), n, k);
        ASSERT_EQ(SelectTopK(x.data(), n, k), want) << "n=" << n << " k=" << k << " mode=" << mode;
        ASSERT_EQ(SelectTopKRadix(x.data(), n, k), want) << "n=" << n << " k=" << k;
      }
    }
  }
}

TEST(CodecSimdTest, CollectsTheIndicesOfKeysAtOrAboveTheThreshold) {
  if (!codec_simd::CpuHasAvx2F16C()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(5);
  std::vector<float> x(1000 + 13);
  for (float& v : x) v = std::normal_distribution<float>()(rng);
  x[7] = NAN;
  x[1000] = -INFINITY;
  const uint32_t t = AbsKey(1.5f);
  std::vector<uint32_t> want;
  for (uint32_t i = 0; i < x.size(); ++i) {
    if (AbsKey(x[i]) >= t) want.push_back(i);
  }
  std::vector<uint32_t> got(x.size());
  ASSERT_EQ(codec_simd::CollectAbsKeysAtLeast(x.data(), x.size(), t, got.data(), got.size()),
            want.size());
  got.resize(want.size());
  EXPECT_EQ(got, want);
  // More than the room given: cap + 1, the first cap in out.
  const size_t cap = want.size() / 2;
  std::vector<uint32_t> some(cap);
  EXPECT_EQ(codec_simd::CollectAbsKeysAtLeast(x.data(), x.size(), t, some.data(), cap), cap + 1);
  EXPECT_TRUE(std::equal(some.begin(), some.end(), want.begin()));
}

TEST(QuantizeInt8Test, RoundTripIsWithinHalfAStepPerGroup) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.f, 0.01f);
  std::vector<float> x(1000), back(1000), scales(NumScaleGroups(1000, 256));
  for (float& v : x) v = d(rng);
  x[300] = 1.f;  // One large value: only its group's scale grows.
  std::vector<int8_t> q(1000);
  QuantizeInt8(x.data(), x.size(), 256, q.data(), scales.data());
  ASSERT_EQ(scales.size(), 4u);
  EXPECT_FLOAT_EQ(scales[1], 1.f / 127.f);
  EXPECT_LT(scales[0], 0.1f / 127.f);
  DequantizeInt8(q.data(), q.size(), 256, scales.data(), back.data());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_LE(std::fabs(back[i] - x[i]), scales[i / 256] / 2 * 1.0001f) << i;
  }
  EXPECT_EQ(q[300], 127);
}

TEST(QuantizeInt8Test, ZeroGroupHasZeroScaleAndNanPoisonsItsScale) {
  std::vector<float> x(8, 0.f);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int8_t> q(8, 9);
  float scales[2];
  QuantizeInt8(x.data(), 8, 4, q.data(), scales);
  EXPECT_EQ(scales[0], 0.f);
  EXPECT_TRUE(std::isnan(scales[1]));
  for (int8_t v : q) EXPECT_EQ(v, 0);
}

TEST(CompressionSpecTest, BadValuesAreRefusedNamingTheField) {
  v1::CompressionSpec cs;
  cs.set_topk_ratio(1.f);
  EXPECT_THAT(CheckCompressionSpec(cs, "t").message(), HasSubstr("t.topk_ratio: must be in [0, 1)"));
  cs.set_topk_ratio(std::nanf(""));
  EXPECT_EQ(CheckCompressionSpec(cs, "t").code(), absl::StatusCode::kInvalidArgument);
  cs.set_topk_ratio(0.01f);
  EXPECT_TRUE(CheckCompressionSpec(cs, "t").ok());
  cs.set_quantize(v1::CompressionSpec::QUANTIZE_INT8);
  EXPECT_THAT(CheckCompressionSpec(cs, "t").message(),
              HasSubstr("t.quantize: top-k (topk_ratio) and int8 quantization cannot be combined"));
  cs.set_topk_ratio(0);
  EXPECT_TRUE(CheckCompressionSpec(cs, "t").ok());
  cs.set_transport(v1::DT_FLOAT16);
  EXPECT_THAT(CheckCompressionSpec(cs, "t").message(), HasSubstr("t.transport: quantize int8"));
  cs.set_transport(v1::DT_FLOAT32);
  cs.set_quantize(static_cast<v1::CompressionSpec::Quantize>(7));
  EXPECT_THAT(CheckCompressionSpec(cs, "t").message(), HasSubstr("t.quantize: must be none or int8"));
}

TEST(CompressionSpecTest, SparseTablesAreNotCompressed) {
  v1::TableSpec t;
  t.set_name("emb");
  t.set_kind(v1::SPARSE);
  t.mutable_compression()->set_topk_ratio(0.1f);
  absl::Status st = CheckGradientCompression(t, "tables[0]");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("tables[0].compression.topk_ratio: applies to dense tables"));
  t.set_kind(v1::DENSE);
  EXPECT_TRUE(CheckGradientCompression(t, "tables[0]").ok());
}

TEST(CompressionSpecTest, PullCompressionNeedsADenseTableOfModestBlocks) {
  v1::TableSpec t;
  t.set_name("w");
  t.set_kind(v1::DENSE);
  t.mutable_compression()->set_pull_topk_ratio(0.05f);
  EXPECT_TRUE(CheckGradientCompression(t, "tables[0]").ok());
  t.set_block_elems(kMaxPullViewBlockElems + 1);
  EXPECT_THAT(CheckGradientCompression(t, "tables[0]").message(),
              HasSubstr("tables[0].compression.pull_topk_ratio: needs blocks of at most 1048576"));
  t.set_block_elems(0);
  t.set_kind(v1::SPARSE);
  EXPECT_THAT(CheckGradientCompression(t, "tables[0]").message(),
              HasSubstr("tables[0].compression.pull_topk_ratio: applies to dense tables only"));
  t.set_kind(v1::DENSE);
  t.mutable_compression()->set_pull_topk_ratio(1.f);
  EXPECT_THAT(CheckGradientCompression(t, "tables[0]").message(),
              HasSubstr("tables[0].compression.pull_topk_ratio: must be in [0, 1)"));
}

}  // namespace
}  // namespace pscluster
