#include "common/dtype.h"

#include <cstring>

namespace pscluster {

size_t DTypeSize(v1::DataType dtype) {
  switch (dtype) {
    case v1::DT_FLOAT32:
    case v1::DT_INT32:
      return 4;
    case v1::DT_FLOAT16:
    case v1::DT_BFLOAT16:
      return 2;
    case v1::DT_FLOAT64:
    case v1::DT_INT64:
    case v1::DT_UINT64:
      return 8;
    default:
      return 0;
  }
}

std::string_view DTypeName(v1::DataType dtype) {
  switch (dtype) {
    case v1::DT_FLOAT32: return "float32";
    case v1::DT_FLOAT16: return "float16";
    case v1::DT_BFLOAT16: return "bfloat16";
    case v1::DT_FLOAT64: return "float64";
    case v1::DT_INT32: return "int32";
    case v1::DT_INT64: return "int64";
    case v1::DT_UINT64: return "uint64";
    default: return "invalid";
  }
}

static inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

static inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x = Bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) {  // Inf or NaN (keep NaN quiet and non-zero).
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0));
  }
  int32_t e = static_cast<int32_t>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // Overflow -> inf.
  if (e <= 0) {                                                   // Subnormal or zero.
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // May carry into exponent: ok.
  return static_cast<uint16_t>(half);
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return FromBits(sign);
    // Subnormal: normalise.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return FromBits(sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13));
  }
  if (exp == 0x1f) return FromBits(sign | 0x7f800000u | (mant << 13));
  return FromBits(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x = Bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN.
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

float BFloat16ToFloat(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

void EncodeFloats(const float* in, size_t n, v1::DataType dtype, void* out) {
  switch (dtype) {
    case v1::DT_FLOAT16: {
      auto* o = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = FloatToHalf(in[i]);
      return;
    }
    case v1::DT_BFLOAT16: {
      auto* o = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = FloatToBFloat16(in[i]);
      return;
    }
    default:
      std::memcpy(out, in, n * sizeof(float));
  }
}

void DecodeFloats(const void* in, size_t n, v1::DataType dtype, float* out) {
  switch (dtype) {
    case v1::DT_FLOAT16: {
      const auto* i16 = static_cast<const uint16_t*>(in);
      for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(i16[i]);
      return;
    }
    case v1::DT_BFLOAT16: {
      const auto* i16 = static_cast<const uint16_t*>(in);
      for (size_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(i16[i]);
      return;
    }
    default:
      std::memcpy(out, in, n * sizeof(float));
  }
}

}  // namespace pscluster
