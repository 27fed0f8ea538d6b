#include "common/codec_simd.h"

#include "common/half_bits.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pscluster::codec_simd {

#if defined(__x86_64__)

#define PSCLUSTER_AVX2_F16C __attribute__((target("avx2,f16c")))

bool CpuHasAvx2F16C() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  }();
  return has;
}

PSCLUSTER_AVX2_F16C void FloatsToHalf(const float* in, size_t n, uint16_t* out) {
  size_t i = 0;
  // vcvtps2ph with an immediate rounding mode (round to nearest even, MXCSR not consulted):
  // NaNs come out quiet with the payload's top bits, as FloatToHalfBits makes them.
  for (; i + 16 <= n; i += 16) {
    const __m128i a = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    const __m128i b = _mm256_cvtps_ph(_mm256_loadu_ps(in + i + 8), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 8), b);
  }
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) out[i] = FloatToHalfBits(in[i]);
}

namespace {

// vcvtph2ps of 8 halves, with signaling NaNs (exponent all ones, fraction's top bit clear,
// fraction not zero) kept signaling as HalfBitsToFloat keeps them: the instruction sets the
// float's quiet bit.
PSCLUSTER_AVX2_F16C inline __m256 HalfToFloat8(__m128i h) {
  const __m256 f = _mm256_cvtph_ps(h);
  const __m256i h32 = _mm256_cvtepu16_epi32(h);
  const __m256i is_inf_or_snan = _mm256_cmpeq_epi32(
      _mm256_and_si256(h32, _mm256_set1_epi32(0x7e00)), _mm256_set1_epi32(0x7c00));
  const __m256i is_inf = _mm256_cmpeq_epi32(_mm256_and_si256(h32, _mm256_set1_epi32(0x1ff)),
                                            _mm256_setzero_si256());
  const __m256i is_snan = _mm256_andnot_si256(is_inf, is_inf_or_snan);
  const __m256i quiet = _mm256_and_si256(is_snan, _mm256_set1_epi32(0x00400000));
  return _mm256_castsi256_ps(_mm256_andnot_si256(quiet, _mm256_castps_si256(f)));
}

}  // namespace

PSCLUSTER_AVX2_F16C void HalfToFloats(const uint16_t* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 8));
    _mm256_storeu_ps(out + i, HalfToFloat8(a));
    _mm256_storeu_ps(out + i + 8, HalfToFloat8(b));
  }
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i,
                     HalfToFloat8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < n; ++i) out[i] = HalfBitsToFloat(in[i]);
}

PSCLUSTER_AVX2_F16C uint32_t MaxAbsKey(const float* x, size_t n) {
  const __m256i abs = _mm256_set1_epi32(0x7fffffff);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8));
    m0 = _mm256_max_epu32(m0, _mm256_and_si256(a, abs));
    m1 = _mm256_max_epu32(m1, _mm256_and_si256(b, abs));
  }
  m0 = _mm256_max_epu32(m0, m1);
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(m0), _mm256_extracti128_si256(m0, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
  uint32_t key = static_cast<uint32_t>(_mm_cvtsi128_si32(m));
  for (; i < n; ++i) {
    const uint32_t k = AbsKey(x[i]);
    if (k > key) key = k;
  }
  return key;
}

namespace {

// 8 values scaled, rounded in the current rounding mode (nearbyint's), clamped to +-127, as
// int32 (exact: the values are finite by the caller's contract).
PSCLUSTER_AVX2_F16C inline __m256i Quantize8(const float* x, __m256 inv) {
  const __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), inv),
                                   _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC);
  const __m256 c = _mm256_min_ps(_mm256_set1_ps(127.f), _mm256_max_ps(_mm256_set1_ps(-127.f), v));
  return _mm256_cvttps_epi32(c);
}

}  // namespace

PSCLUSTER_AVX2_F16C void QuantizeInt8Group(const float* x, size_t n, float inv, int8_t* q) {
  const __m256 vinv = _mm256_set1_ps(inv);
  // packs interleaves the 128-bit lanes; this puts the 4-byte runs back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i ab = _mm256_packs_epi32(Quantize8(x + i, vinv), Quantize8(x + i + 8, vinv));
    const __m256i cd =
        _mm256_packs_epi32(Quantize8(x + i + 16, vinv), Quantize8(x + i + 24, vinv));
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), bytes);
  }
  for (; i < n; ++i) {
    float v = __builtin_nearbyintf(x[i] * inv);
    v = v < -127.f ? -127.f : (127.f < v ? 127.f : v);
    q[i] = static_cast<int8_t>(v);
  }
}

PSCLUSTER_AVX2_F16C void DequantizeInt8Group(const int8_t* q, size_t n, float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(lo, s));
    _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(hi, s));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(q[i]) * scale;
}

PSCLUSTER_AVX2_F16C size_t CollectAbsKeysAtLeast(const float* x, size_t n, uint32_t t,
                                                  uint32_t* out, size_t cap) {
  // Keys are below 2^31, so a signed comparison with t - 1 orders them.
  const __m256i abs = _mm256_set1_epi32(0x7fffffff);
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(t - 1));
  size_t count = 0;
  size_t i = 0;
  auto take = [&](uint32_t mask, size_t base) {
    while (mask != 0) {
      if (count == cap) return false;
      out[count++] = static_cast<uint32_t>(base + __builtin_ctz(mask));
      mask &= mask - 1;
    }
    return true;
  };
  for (; i + 32 <= n; i += 32) {
    __m256i k[4];
    for (int j = 0; j < 4; ++j) {
      k[j] = _mm256_cmpgt_epi32(
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8 * j)),
                           abs),
          below);
    }
    const __m256i any = _mm256_or_si256(_mm256_or_si256(k[0], k[1]), _mm256_or_si256(k[2], k[3]));
    if (_mm256_testz_si256(any, any)) continue;  // Most groups: nothing at or above t.
    for (int j = 0; j < 4; ++j) {
      const uint32_t mask =
          static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(k[j])));
      if (!take(mask, i + 8 * j)) return cap + 1;
    }
  }
  for (; i < n; ++i) {
    if (AbsKey(x[i]) >= t) {
      if (count == cap) return cap + 1;
      out[count++] = static_cast<uint32_t>(i);
    }
  }
  return count;
}

#else  // !__x86_64__

bool CpuHasAvx2F16C() { return false; }
void FloatsToHalf(const float*, size_t, uint16_t*) { __builtin_trap(); }
void HalfToFloats(const uint16_t*, size_t, float*) { __builtin_trap(); }
uint32_t MaxAbsKey(const float*, size_t) { __builtin_trap(); }
void QuantizeInt8Group(const float*, size_t, float, int8_t*) { __builtin_trap(); }
void DequantizeInt8Group(const int8_t*, size_t, float, float*) { __builtin_trap(); }
size_t CollectAbsKeysAtLeast(const float*, size_t, uint32_t, uint32_t*, size_t) {
  __builtin_trap();
}

#endif

}  // namespace pscluster::codec_simd
