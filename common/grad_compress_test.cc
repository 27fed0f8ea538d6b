#include "common/grad_compress.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

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

}  // namespace
}  // namespace pscluster
