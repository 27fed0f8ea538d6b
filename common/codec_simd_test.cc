// The vector codecs (common/codec_simd.h, picked by EncodeFloats / DecodeFloats / QuantizeInt8 /
// DequantizeInt8 at run time) against the element-by-element reference code, bit for bit: every
// float16 value, every class of float32 (signed zeros, subnormals of both formats, rounding
// ties, overflow, infinities, NaNs), lengths around the vector widths and pointers off the
// vector alignment. "Unaligned" here means off by whole elements from a 64-byte boundary (the
// kernels load and store unaligned); element-misaligned pointers are not valid C++ arrays.
#include "common/codec_simd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/grad_compress.h"
#include "common/half_bits.h"

namespace pscluster {
namespace {

const size_t kLengths[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1000003};
const size_t kOffsets[] = {0, 1, 3};  // Elements past a 64-byte boundary.

uint32_t Bits(float f) { return FloatBits(f); }

// A 64-byte aligned buffer of T with room for `offset` elements before n.
template <typename T>
struct Buf {
  Buf(size_t n, size_t offset) : store((n + offset) * sizeof(T) + 64), off(offset) {}
  T* data() {
    auto p = reinterpret_cast<uintptr_t>(store.data());
    return reinterpret_cast<T*>((p + 63) & ~uintptr_t{63}) + off;
  }
  std::vector<unsigned char> store;
  size_t off;
};

// Float bit patterns: every class for both formats, then random bits (any class), then random
// values in float16's range.
std::vector<float> EdgeAndRandomFloats(size_t n) {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u,  // +-0
      0x00000001u, 0x807fffffu, 0x00400000u,  // float32 subnormals (to +-0 in float16)
      0x33800000u, 0xb3800000u,  // 2^-24: the smallest float16 subnormal
      0x33000000u, 0xb3000000u,  // 2^-25: a tie between 0 and 2^-24 (to even: 0)
      0x33400000u,               // 0.75 * 2^-24: up to 2^-24
      0x33c00000u,               // 1.5 * 2^-24: a tie, to even (2 * 2^-24)
      0x38800000u, 0x387fc000u,  // 2^-14 (smallest normal half), the largest subnormal half
      0x387fe000u,               // a tie between the largest subnormal and 2^-14
      0x3f801000u, 0xbf801000u,  // 1 + 2^-11: a tie, to even (1)
      0x3f803000u,               // 1 + 3 * 2^-11: a tie, to even (1 + 2^-9)
      0x3f800fffu, 0x3f801001u,  // just below / above a tie
      0x477fe000u, 0xc77fe000u,  // 65504: the largest float16
      0x477fefffu,               // 65519.99: still 65504
      0x477ff000u, 0xc77ff000u,  // 65520: the tie above 65504, to infinity
      0x47800000u, 0x7f7fffffu, 0xff7fffffu,  // 65536, +-FLT_MAX: infinity
      0x7f800000u, 0xff800000u,  // +-inf
      0x7fc00000u, 0xffc00000u,  // quiet NaNs
      0x7f800001u, 0xff800001u,  // signaling NaNs, payload only in the low bits
      0x7fa00000u, 0x7fbfffffu,  // signaling NaNs, payload in the top bits
      0x7fffe000u, 0x7fc02000u,  // quiet NaNs with payload
      0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f7f8000u,  // bfloat16 ties / near ties
  };
  std::mt19937 rng(17);
  while (bits.size() < n / 2) bits.push_back(static_cast<uint32_t>(rng()));
  std::uniform_real_distribution<float> dist(-70000.f, 70000.f);
  std::uniform_int_distribution<int> exp(-30, 16);
  std::vector<float> out(bits.size());
  std::memcpy(out.data(), bits.data(), bits.size() * 4);
  while (out.size() < n) out.push_back(std::ldexp(dist(rng) / 70000.f, exp(rng)));
  out.resize(n);
  return out;
}

// Encodes with the dispatched path, the scalar path and (where the CPU has it) the kernel
// itself, for each length and offset, and requires the bits of the element-wise conversion.
void CheckEncode(v1::DataType dtype, uint16_t (*one)(float)) {
  const std::vector<float> all = EdgeAndRandomFloats(1000003 + 64);
  for (size_t n : kLengths) {
    for (size_t off : kOffsets) {
      Buf<float> in(n, off);
      // Start at different points of the list so that each edge case meets each vector lane.
      std::memcpy(in.data(), all.data() + off * 5, n * 4);
      std::vector<uint16_t> want(n);
      for (size_t i = 0; i < n; ++i) want[i] = one(in.data()[i]);
      Buf<uint16_t> got(n + 1, off);
      got.data()[n] = 0xabcd;  // Nothing written past n.
      EncodeFloats(in.data(), n, dtype, got.data());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), n * 2), 0) << "dispatched n=" << n;
      ASSERT_EQ(got.data()[n], 0xabcd) << n;
      EncodeFloatsScalar(in.data(), n, dtype, got.data());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), n * 2), 0) << "scalar n=" << n;
      if (dtype == v1::DT_FLOAT16 && codec_simd::CpuHasAvx2F16C()) {
        std::memset(got.data(), 0, n * 2);
        codec_simd::FloatsToHalf(in.data(), n, got.data());
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(got.data()[i], want[i])
              << "F16C n=" << n << " float bits " << std::hex << Bits(in.data()[i]);
        }
      }
    }
  }
}

TEST(CodecSimdTest, ReportsTheCpu) {
  // Not a requirement of the product (the scalar code runs elsewhere), but the checks below of
  // the kernels themselves only mean something where this is true.
  std::printf("AVX2 + F16C kernels: %s\n", codec_simd::CpuHasAvx2F16C() ? "yes" : "no");
}

// The scalar reference, as the kernels must reproduce it: rounding ties to even, overflow to
// infinity, NaN quiet with the payload's top 10 bits (low-bit payloads are lost, the quiet bit
// keeps it a NaN), signaling float16 NaNs decoded as signaling float32 NaNs.
TEST(CodecSimdTest, ScalarReferenceEdgeCases) {
  auto half = [](uint32_t b) { return FloatToHalfBits(BitsToFloat(b)); };
  EXPECT_EQ(half(0x80000000u), 0x8000);
  EXPECT_EQ(half(0x00000001u), 0x0000);
  EXPECT_EQ(half(0x33000000u), 0x0000);
  EXPECT_EQ(half(0x33c00000u), 0x0002);
  EXPECT_EQ(half(0x3f801000u), 0x3c00);
  EXPECT_EQ(half(0x3f803000u), 0x3c02);
  EXPECT_EQ(half(0x477fefffu), 0x7bff);
  EXPECT_EQ(half(0x477ff000u), 0x7c00);
  EXPECT_EQ(half(0xff800000u), 0xfc00);
  EXPECT_EQ(half(0x7f800001u), 0x7e00);
  EXPECT_EQ(half(0xffa00000u), 0xfe00 | 0x100);
  EXPECT_EQ(half(0x7fffe000u), 0x7fff);
  EXPECT_EQ(Bits(HalfBitsToFloat(0x7c01)), 0x7f802000u);  // Stays signaling.
  EXPECT_EQ(Bits(HalfBitsToFloat(0xfe00)), 0xffc00000u);
  EXPECT_EQ(Bits(HalfBitsToFloat(0x0001)), 0x33800000u);
  uint16_t h[3];
  const float f[3] = {1.f, -0.f, 65520.f};
  EncodeFloatsScalar(f, 3, v1::DT_FLOAT16, h);
  EXPECT_EQ(h[0], 0x3c00);
  EXPECT_EQ(h[1], 0x8000);
  EXPECT_EQ(h[2], 0x7c00);
  float back[3];
  DecodeFloatsScalar(h, 3, v1::DT_FLOAT16, back);
  EXPECT_EQ(back[0], 1.f);
  EXPECT_TRUE(std::signbit(back[1]));
  EXPECT_TRUE(std::isinf(back[2]));
}

// All 65536 float16 values decode to the reference's float bits (NaN payloads and signaling
// NaNs included), at every offset and through each path.
TEST(CodecSimdTest, EveryHalfDecodesLikeTheReference) {
  for (size_t off : kOffsets) {
    Buf<uint16_t> in(0x10000, off);
    for (uint32_t h = 0; h < 0x10000; ++h) in.data()[h] = static_cast<uint16_t>(h);
    Buf<float> got(0x10000 + 1, off);
    got.data()[0x10000] = 42.f;
    DecodeFloats(in.data(), 0x10000, v1::DT_FLOAT16, got.data());
    for (uint32_t h = 0; h < 0x10000; ++h) {
      ASSERT_EQ(Bits(got.data()[h]), Bits(HalfBitsToFloat(h))) << "dispatched half " << std::hex << h;
    }
    ASSERT_EQ(got.data()[0x10000], 42.f);
    DecodeFloatsScalar(in.data(), 0x10000, v1::DT_FLOAT16, got.data());
    for (uint32_t h = 0; h < 0x10000; ++h) {
      ASSERT_EQ(Bits(got.data()[h]), Bits(HalfBitsToFloat(h))) << "scalar half " << std::hex << h;
    }
    if (codec_simd::CpuHasAvx2F16C()) {
      std::memset(got.data(), 0, 0x10000 * 4);
      codec_simd::HalfToFloats(in.data(), 0x10000, got.data());
      for (uint32_t h = 0; h < 0x10000; ++h) {
        ASSERT_EQ(Bits(got.data()[h]), Bits(HalfBitsToFloat(h))) << "F16C half " << std::hex << h;
      }
    }
  }
}

TEST(CodecSimdTest, HalfDecodeAtEveryLength) {
  std::mt19937 rng(3);
  for (size_t n : kLengths) {
    for (size_t off : kOffsets) {
      Buf<uint16_t> in(n, off);
      for (size_t i = 0; i < n; ++i) in.data()[i] = static_cast<uint16_t>(rng());
      Buf<float> got(n + 1, off);
      got.data()[n] = 42.f;
      DecodeFloats(in.data(), n, v1::DT_FLOAT16, got.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(Bits(got.data()[i]), Bits(HalfBitsToFloat(in.data()[i]))) << n << " " << i;
      }
      ASSERT_EQ(got.data()[n], 42.f);
    }
  }
}

TEST(CodecSimdTest, HalfEncodeMatchesTheReference) { CheckEncode(v1::DT_FLOAT16, FloatToHalfBits); }

TEST(CodecSimdTest, BFloat16EncodeMatchesTheReference) {
  CheckEncode(v1::DT_BFLOAT16, FloatToBFloat16Bits);
}

TEST(CodecSimdTest, BFloat16DecodeMatchesTheReference) {
  for (size_t off : kOffsets) {
    Buf<uint16_t> in(0x10000, off);
    for (uint32_t h = 0; h < 0x10000; ++h) in.data()[h] = static_cast<uint16_t>(h);
    std::vector<float> got(0x10000), ref(0x10000);
    DecodeFloats(in.data(), 0x10000, v1::DT_BFLOAT16, got.data());
    DecodeFloatsScalar(in.data(), 0x10000, v1::DT_BFLOAT16, ref.data());
    for (uint32_t h = 0; h < 0x10000; ++h) {
      ASSERT_EQ(Bits(got[h]), Bits(BFloat16BitsToFloat(h))) << std::hex << h;
      ASSERT_EQ(Bits(ref[h]), Bits(BFloat16BitsToFloat(h))) << std::hex << h;
    }
  }
}

// ---- int8 ----

// Gradient-like groups with planted special groups: all zero, a NaN (two NaNs with different
// payloads: the scale is the later one's), an infinity, values so small that 1 / scale
// overflows, and values whose x / scale are exact ties (scale 1: 2.5 -> 2, -3.5 -> -4, 0.5 -> 0).
std::vector<float> Int8Input(size_t n, size_t group, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1e-2f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  const size_t groups = NumScaleGroups(n, group);
  for (size_t g = 0; g < groups; ++g) {
    const size_t first = g * group, end = std::min(n, first + group);
    switch (g % 7) {
      case 1:
        for (size_t i = first; i < end; ++i) x[i] = (i % 2) ? 0.f : -0.f;
        break;
      case 2:
        x[first + (end - first) / 3] = BitsToFloat(0x7fc00123u);
        x[end - 1] = BitsToFloat(0xffc00456u);
        break;
      case 3:
        x[first + (end - first) / 2] = -std::numeric_limits<float>::infinity();
        break;
      case 4:
        for (size_t i = first; i < end; ++i) x[i] *= 1e-36f;
        if (end - first > 2) x[first + 1] = 0.f;
        break;
      case 5: {
        const float ties[] = {127.f, 2.5f, -3.5f, 0.5f, -0.5f, 126.5f, -126.5f, 1.5f};
        for (size_t i = first; i < end; ++i) x[i] = ties[(i - first) % 8];
        break;
      }
      case 6:  // Subnormal inputs in a normal group.
        for (size_t i = first; i < end; i += 2) x[i] = BitsToFloat(0x00000005u + i);
        break;
      default:
        break;
    }
  }
  return x;
}

TEST(CodecSimdTest, Int8MatchesTheReference) {
  std::mt19937 rng(9);
  for (size_t group : {size_t{kInt8ScaleGroup}, size_t{7}, size_t{33}, size_t{1}}) {
    for (size_t n : kLengths) {
      if (group == 1 && n > 1000) continue;
      for (size_t off : kOffsets) {
        const std::vector<float> src = Int8Input(n, group, rng);
        Buf<float> x(n, off);
        std::memcpy(x.data(), src.data(), n * 4);
        const size_t groups = NumScaleGroups(n, group);
        std::vector<int8_t> want_q(n);
        std::vector<float> want_s(groups);
        QuantizeInt8Scalar(x.data(), n, group, want_q.data(), want_s.data());
        Buf<int8_t> q(n + 1, off);
        q.data()[n] = 99;
        std::vector<float> s(groups);
        QuantizeInt8(x.data(), n, group, q.data(), s.data());
        ASSERT_EQ(std::memcmp(q.data(), want_q.data(), n), 0) << "n=" << n << " group=" << group;
        ASSERT_EQ(q.data()[n], 99);
        ASSERT_EQ(std::memcmp(s.data(), want_s.data(), groups * 4), 0)
            << "n=" << n << " group=" << group;

        std::vector<float> want_out(n);
        DequantizeInt8Scalar(want_q.data(), n, group, want_s.data(), want_out.data());
        Buf<float> out(n + 1, off);
        out.data()[n] = 42.f;
        DequantizeInt8(q.data(), n, group, s.data(), out.data());
        ASSERT_EQ(std::memcmp(out.data(), want_out.data(), n * 4), 0) << "n=" << n;
        ASSERT_EQ(out.data()[n], 42.f);
      }
    }
  }
}

// The scalar reference's own answers on the planted groups.
TEST(CodecSimdTest, Int8ScalarReference) {
  const float ties[8] = {127.f, 2.5f, -3.5f, 0.5f, -0.5f, 126.5f, -126.5f, 1.5f};
  int8_t q[8];
  float scale;
  QuantizeInt8Scalar(ties, 8, 8, q, &scale);
  EXPECT_EQ(scale, 1.f);
  const int8_t want[8] = {127, 2, -4, 0, 0, 126, -126, 2};
  EXPECT_EQ(std::memcmp(q, want, 8), 0);
  const float nan_group[3] = {1.f, BitsToFloat(0x7fc00123u), BitsToFloat(0xffc00456u)};
  QuantizeInt8Scalar(nan_group, 3, 3, q, &scale);
  EXPECT_TRUE(std::isnan(scale));
  EXPECT_EQ(q[0], 0);
  const float zeros[2] = {0.f, -0.f};
  QuantizeInt8Scalar(zeros, 2, 2, q, &scale);
  EXPECT_EQ(Bits(scale), 0u);
  float out[8];
  const int8_t qs[3] = {-127, 0, 5};
  const float scales[2] = {2.f, 0.5f};
  DequantizeInt8Scalar(qs, 3, 2, scales, out);
  EXPECT_EQ(out[0], -254.f);
  EXPECT_EQ(out[1], 0.f);
  EXPECT_EQ(out[2], 2.5f);
}

}  // namespace
}  // namespace pscluster
