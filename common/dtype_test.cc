#include "common/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace pscluster {
namespace {

TEST(DTypeTest, Sizes) {
  EXPECT_EQ(DTypeSize(v1::DT_FLOAT32), 4u);
  EXPECT_EQ(DTypeSize(v1::DT_FLOAT16), 2u);
  EXPECT_EQ(DTypeSize(v1::DT_BFLOAT16), 2u);
  EXPECT_EQ(DTypeSize(v1::DT_UINT64), 8u);
  EXPECT_EQ(DTypeSize(v1::DT_INVALID), 0u);
  EXPECT_EQ(DTypeSize(static_cast<v1::DataType>(77)), 0u);
}

// Every finite half converts to float and back to itself.
TEST(DTypeTest, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << h;
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), h) << "half bits " << h;
  }
}

TEST(DTypeTest, HalfRoundsToNearestWithinHalfAnUlp) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-60000.f, 60000.f);
  for (int i = 0; i < 100000; ++i) {
    float f = dist(rng);
    float back = HalfToFloat(FloatToHalf(f));
    // Relative spacing of half is 2^-10; rounding error at most half of that.
    EXPECT_LE(std::fabs(back - f), std::fabs(f) * std::ldexp(1.0f, -11) + 1e-7f) << f;
  }
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
  EXPECT_EQ(HalfToFloat(FloatToHalf(1e-9f)), 0.0f);
}

TEST(DTypeTest, BFloat16KeepsRangeAndRoundsToNearest) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1e30f, 1e30f);
  for (int i = 0; i < 100000; ++i) {
    float f = dist(rng);
    float back = BFloat16ToFloat(FloatToBFloat16(f));
    EXPECT_LE(std::fabs(back - f), std::fabs(f) * std::ldexp(1.0f, -8)) << f;
  }
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f)), 1.0f);
}

TEST(DTypeTest, EncodeDecodeArrays) {
  std::vector<float> in = {0.f, 1.f, -2.5f, 3.14159f, 1e-3f};
  for (auto dt : {v1::DT_FLOAT32, v1::DT_FLOAT16, v1::DT_BFLOAT16}) {
    std::vector<char> buf(in.size() * DTypeSize(dt));
    EncodeFloats(in.data(), in.size(), dt, buf.data());
    std::vector<float> out(in.size(), -99.f);
    DecodeFloats(buf.data(), in.size(), dt, out.data());
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_NEAR(out[i], in[i], std::fabs(in[i]) * 1e-2f) << DTypeName(dt) << " " << i;
    }
  }
}

}  // namespace
}  // namespace pscluster
