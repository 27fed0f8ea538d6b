#include "common/dtype.h"

#include "common/codec_simd.h"
#include "common/half_bits.h"

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
    case v1::DT_INT8:
      return 1;
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
    case v1::DT_INT8: return "int8";
    default: return "invalid";
  }
}

namespace {

// bfloat16 arrays, branch-free so the compiler vectorises them (with AVX2 / AVX-512 clones picked
// at load time): the same bits as FloatToBFloat16Bits / BFloat16BitsToFloat element by element.
__attribute__((target_clones("avx512f", "avx2", "default"))) void FloatsToBFloat16(
    const float* __restrict in, size_t n, uint16_t* __restrict out) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, in + i, 4);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t quiet = (x >> 16) | 0x40u;
    out[i] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void BFloat16ToFloats(
    const uint16_t* __restrict in, size_t n, float* __restrict out) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &x, 4);
  }
}

}  // namespace

uint16_t FloatToHalf(float f) { return FloatToHalfBits(f); }
float HalfToFloat(uint16_t h) { return HalfBitsToFloat(h); }
uint16_t FloatToBFloat16(float f) { return FloatToBFloat16Bits(f); }
float BFloat16ToFloat(uint16_t b) { return BFloat16BitsToFloat(b); }

void EncodeFloats(const float* in, size_t n, v1::DataType dtype, void* out) {
  switch (dtype) {
    case v1::DT_FLOAT16:
      if (codec_simd::CpuHasAvx2F16C()) {
        codec_simd::FloatsToHalf(in, n, static_cast<uint16_t*>(out));
        return;
      }
      break;
    case v1::DT_BFLOAT16:
      FloatsToBFloat16(in, n, static_cast<uint16_t*>(out));
      return;
    default:
      break;
  }
  EncodeFloatsScalar(in, n, dtype, out);
}

void DecodeFloats(const void* in, size_t n, v1::DataType dtype, float* out) {
  switch (dtype) {
    case v1::DT_FLOAT16:
      if (codec_simd::CpuHasAvx2F16C()) {
        codec_simd::HalfToFloats(static_cast<const uint16_t*>(in), n, out);
        return;
      }
      break;
    case v1::DT_BFLOAT16:
      BFloat16ToFloats(static_cast<const uint16_t*>(in), n, out);
      return;
    default:
      break;
  }
  DecodeFloatsScalar(in, n, dtype, out);
}

void EncodeFloatsScalar(const float* in, size_t n, v1::DataType dtype, void* out) {
  switch (dtype) {
    case v1::DT_FLOAT16: {
      auto* o = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = FloatToHalfBits(in[i]);
      return;
    }
    case v1::DT_BFLOAT16: {
      auto* o = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = FloatToBFloat16Bits(in[i]);
      return;
    }
    default:
      std::memcpy(out, in, n * sizeof(float));
  }
}

void DecodeFloatsScalar(const void* in, size_t n, v1::DataType dtype, float* out) {
  switch (dtype) {
    case v1::DT_FLOAT16: {
      const auto* i16 = static_cast<const uint16_t*>(in);
      for (size_t i = 0; i < n; ++i) out[i] = HalfBitsToFloat(i16[i]);
      return;
    }
    case v1::DT_BFLOAT16: {
      const auto* i16 = static_cast<const uint16_t*>(in);
      for (size_t i = 0; i < n; ++i) out[i] = BFloat16BitsToFloat(i16[i]);
      return;
    }
    default:
      std::memcpy(out, in, n * sizeof(float));
  }
}

}  // namespace pscluster
