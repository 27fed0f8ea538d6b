// float32 <-> float16 / bfloat16 bit conversions: the one implementation behind common/dtype.h's
// transport encoding, the CPU backend and the CUDA kernels (host and device code). Round to
// nearest even, NaN stays a quiet NaN with the payload's top bits, fp16 overflow becomes
// infinity. No dependencies, so nvcc can compile it.
#ifndef PSCLUSTER_COMMON_HALF_BITS_H_
#define PSCLUSTER_COMMON_HALF_BITS_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PSCLUSTER_HOST_DEVICE __host__ __device__
#else
#define PSCLUSTER_HOST_DEVICE
#endif

namespace pscluster {

PSCLUSTER_HOST_DEVICE inline uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

PSCLUSTER_HOST_DEVICE inline float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

PSCLUSTER_HOST_DEVICE inline uint16_t FloatToHalfBits(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) {
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
  }
  const int32_t e = static_cast<int32_t>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(half);
}

PSCLUSTER_HOST_DEVICE inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return BitsToFloat(sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13));
  }
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  return BitsToFloat(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

PSCLUSTER_HOST_DEVICE inline uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

PSCLUSTER_HOST_DEVICE inline float BFloat16BitsToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

// The ordering key TopKAbs ranks by: |x| as an unsigned integer (monotone in |x| for numbers;
// every NaN ranks above infinity).
PSCLUSTER_HOST_DEVICE inline uint32_t AbsKey(float f) { return FloatBits(f) & 0x7fffffffu; }

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_HALF_BITS_H_
