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

// The vectorised array conversions give the scalar conversions' bits for every float class:
// rounding ties both ways, NaNs (quieted, payload kept), infinities, subnormals, signed zeros.
TEST(DTypeTest, BFloat16ArraysMatchTheScalarConversionBitForBit) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7f800001u,
                                0xffc00000u, 0x7fbfffffu, 0x00000001u, 0x807fffffu, 0x3f808000u,
                                0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x3f7f8000u};
  std::mt19937 rng(5);
  for (int i = 0; i < 100003; ++i) bits.push_back(static_cast<uint32_t>(rng()));
  std::vector<float> in(bits.size());
  std::memcpy(in.data(), bits.data(), bits.size() * 4);
  std::vector<uint16_t> enc(in.size());
  EncodeFloats(in.data(), in.size(), v1::DT_BFLOAT16, enc.data());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(enc[i], FloatToBFloat16(in[i])) << "float bits " << std::hex << bits[i];
  }
  std::vector<float> dec(enc.size());
  DecodeFloats(enc.data(), enc.size(), v1::DT_BFLOAT16, dec.data());
  for (size_t i = 0; i < enc.size(); ++i) {
    const float want = BFloat16ToFloat(enc[i]);
    ASSERT_EQ(std::memcmp(&dec[i], &want, 4), 0) << "bfloat16 bits " << std::hex << enc[i];
  }
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
