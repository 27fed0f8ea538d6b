#include "server/aes_gcm.h"

#include <openssl/crypto.h>

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
// GCC 12's AVX-512 headers start some intrinsics from an "undefined" register, which its
// uninitialized-use warnings report inside the headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace pscluster {

VectorAesGcm::~VectorAesGcm() {
  OPENSSL_cleanse(round_keys_, sizeof(round_keys_));
  OPENSSL_cleanse(h_powers_, sizeof(h_powers_));
}

#if defined(__x86_64__)

// Every function that uses the instructions carries one of these targets; nothing in the file is
// compiled for them otherwise, so the code runs on any x86-64 until Supports() is asked. What
// both widths share has the narrower target (GCC inlines it into the wider).
#define PS_AES_256 __attribute__((target("aes,pclmul,avx,avx2,vaes,vpclmulqdq")))
#define PS_AES_512 \
  __attribute__((target("aes,pclmul,avx,avx2,avx512f,avx512bw,avx512vl,vaes,vpclmulqdq")))

bool VectorAesGcm::Supports(int bits) {
  __builtin_cpu_init();
  const bool v256 = __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul") &&
                    __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vaes") &&
                    __builtin_cpu_supports("vpclmulqdq");
  if (bits == 256) return v256;
  if (bits == 512) {
    return v256 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }
  return false;
}

bool VectorAesGcm::Supported() { return Supports(256); }

VectorAesGcm::VectorAesGcm(int bits)
    : bits_(bits != 0 ? bits : Supports(512) ? 512 : 256) {}

namespace {

// Reverses the bytes of each 128-bit lane: GHASH works on the blocks byte-reversed, so that the
// carry-less multiply sees GCM's bit order (Gueron and Kounavis, "Intel Carry-Less
// Multiplication Instruction and its Usage for Computing the GCM Mode", algorithm 5).
PS_AES_256 inline __m128i Reverse(__m128i v) {
  return _mm_shuffle_epi8(v, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

PS_AES_512 inline __m512i Reverse4(__m512i v) {
  return _mm512_shuffle_epi8(
      v, _mm512_set4_epi32(0x00010203, 0x04050607, 0x08090a0b, 0x0c0d0e0f));
}

// The 256-bit product lo + hi * x^128 of two byte-reversed elements, shifted left by one bit and
// reduced modulo x^128 + x^127 + x^126 + x^121 + 1 (in the reflected order): the GCM product.
PS_AES_256 inline __m128i Reduce(__m128i lo, __m128i hi) {
  __m128i t7 = _mm_srli_epi32(lo, 31);
  __m128i t8 = _mm_srli_epi32(hi, 31);
  lo = _mm_slli_epi32(lo, 1);
  hi = _mm_slli_epi32(hi, 1);
  __m128i t9 = _mm_srli_si128(t7, 12);
  t8 = _mm_slli_si128(t8, 4);
  t7 = _mm_slli_si128(t7, 4);
  lo = _mm_or_si128(lo, t7);
  hi = _mm_or_si128(_mm_or_si128(hi, t8), t9);
  t7 = _mm_xor_si128(_mm_xor_si128(_mm_slli_epi32(lo, 31), _mm_slli_epi32(lo, 30)),
                     _mm_slli_epi32(lo, 25));
  t8 = _mm_srli_si128(t7, 4);
  t7 = _mm_slli_si128(t7, 12);
  lo = _mm_xor_si128(lo, t7);
  __m128i t2 = _mm_xor_si128(_mm_xor_si128(_mm_srli_epi32(lo, 1), _mm_srli_epi32(lo, 2)),
                             _mm_xor_si128(_mm_srli_epi32(lo, 7), t8));
  lo = _mm_xor_si128(lo, t2);
  return _mm_xor_si128(hi, lo);
}

// lo, hi and the middle terms of a schoolbook product folded into lo and hi, then reduced.
PS_AES_256 inline __m128i Fold(__m128i lo, __m128i hi, __m128i mid) {
  lo = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
  hi = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
  return Reduce(lo, hi);
}

// Fold of Karatsuba sums: the middle term is (a_lo ^ a_hi)(b_lo ^ b_hi) ^ lo ^ hi.
PS_AES_256 inline __m128i Fold3(__m128i lo, __m128i hi, __m128i kara) {
  return Fold(lo, hi, _mm_xor_si128(kara, _mm_xor_si128(lo, hi)));
}

PS_AES_256 inline __m128i GfMul(__m128i a, __m128i b) {
  const __m128i lo = _mm_clmulepi64_si128(a, b, 0x00);
  const __m128i hi = _mm_clmulepi64_si128(a, b, 0x11);
  const __m128i mid =
      _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01), _mm_clmulepi64_si128(a, b, 0x10));
  return Fold(lo, hi, mid);
}

// The XOR of a register's four 128-bit lanes.
PS_AES_512 inline __m128i Xor4(__m512i v) {
  const __m256i a =
      _mm256_xor_si256(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  return _mm_xor_si128(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
}

// Adds the four lanes' products of x and h to lo, hi and mid.
// Karatsuba: three carry-less multiplies a block instead of four (the multiplier is what limits
// GHASH here). `hk` holds each power's halves XORed; the middle term is completed by Fold3.
PS_AES_512 inline void MulAdd(__m512i x, __m512i h, __m512i hk, __m512i* lo, __m512i* hi,
                              __m512i* mid) {
  *lo = _mm512_xor_si512(*lo, _mm512_clmulepi64_epi128(x, h, 0x00));
  *hi = _mm512_xor_si512(*hi, _mm512_clmulepi64_epi128(x, h, 0x11));
  const __m512i xk = _mm512_xor_si512(x, _mm512_shuffle_epi32(x, _MM_PERM_BADC));
  *mid = _mm512_xor_si512(*mid, _mm512_clmulepi64_epi128(xk, hk, 0x00));
}

PS_AES_512 inline __m512i InLane0(__m128i v) {
  return _mm512_inserti32x4(_mm512_setzero_si512(), v, 0);
}

PS_AES_512 inline __mmask64 FirstBytes(size_t n) {
  return n >= 64 ? ~__mmask64{0} : ((__mmask64{1} << n) - 1);
}

constexpr int kPowers = 32;
// Where the powers' XORed halves (for Karatsuba) start, after the powers.
constexpr size_t kKaratsuba = kPowers * 16;

// GHASH of `n` bytes (the last block zero-padded) on from the byte-reversed state y.
PS_AES_512 __m128i Ghash512(const unsigned char* powers, __m128i y, const unsigned char* p,
                            size_t n) {
  if (n >= 512) {
    __m512i h[8], hk[8];
    for (int j = 0; j < 8; ++j) {
      h[j] = _mm512_load_si512(powers + 64 * j);
      hk[j] = _mm512_load_si512(powers + kKaratsuba + 64 * j);
    }
    for (; n >= 512; p += 512, n -= 512) {
      __m512i lo = _mm512_setzero_si512(), hi = lo, mid = lo;
      MulAdd(_mm512_xor_si512(Reverse4(_mm512_loadu_si512(p)), InLane0(y)), h[0], hk[0], &lo,
             &hi, &mid);
#pragma GCC unroll 8
      for (int j = 1; j < 8; ++j) {
        MulAdd(Reverse4(_mm512_loadu_si512(p + 64 * j)), h[j], hk[j], &lo, &hi, &mid);
      }
      y = Fold3(Xor4(lo), Xor4(hi), Xor4(mid));
    }
  }
  const __m512i h4 = _mm512_load_si512(powers + 448);  // H^4 .. H^1
  const __m512i hk4 = _mm512_load_si512(powers + kKaratsuba + 448);
  for (; n >= 64; p += 64, n -= 64) {
    __m512i lo = _mm512_setzero_si512(), hi = lo, mid = lo;
    MulAdd(_mm512_xor_si512(Reverse4(_mm512_loadu_si512(p)), InLane0(y)), h4, hk4, &lo, &hi,
           &mid);
    y = Fold3(Xor4(lo), Xor4(hi), Xor4(mid));
  }
  const __m128i h = _mm_load_si128(reinterpret_cast<const __m128i*>(powers + 496));
  for (; n > 0; p += 16, n -= n < 16 ? n : 16) {
    const __m128i b = _mm_maskz_loadu_epi8(static_cast<__mmask16>(FirstBytes(n < 16 ? n : 16)), p);
    y = GfMul(_mm_xor_si128(Reverse(b), y), h);
  }
  return y;
}

PS_AES_256 inline __m128i EncryptBlock(const unsigned char* round_keys, int rounds, __m128i b) {
  const __m128i* rk = reinterpret_cast<const __m128i*>(round_keys);
  b = _mm_xor_si128(b, _mm_load_si128(rk));
  for (int r = 1; r < rounds; ++r) b = _mm_aesenc_si128(b, _mm_load_si128(rk + r));
  return _mm_aesenclast_si128(b, _mm_load_si128(rk + rounds));
}

// The counter block of `nonce` and block counter `counter` (big-endian in the last four bytes).
PS_AES_256 inline __m128i CounterBlock(const unsigned char* nonce, uint32_t counter) {
  alignas(16) unsigned char block[16];
  std::memcpy(block, nonce, VectorAesGcm::kNonceBytes);
  block[12] = static_cast<unsigned char>(counter >> 24);
  block[13] = static_cast<unsigned char>(counter >> 16);
  block[14] = static_cast<unsigned char>(counter >> 8);
  block[15] = static_cast<unsigned char>(counter);
  return _mm_load_si128(reinterpret_cast<const __m128i*>(block));
}

PS_AES_256 inline __m128i Assist128(__m128i key, __m128i assist) {
  assist = _mm_shuffle_epi32(assist, 0xff);
  key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
  key = _mm_xor_si128(key, _mm_slli_si128(key, 8));
  return _mm_xor_si128(key, assist);
}

PS_AES_256 inline __m128i Assist256Odd(__m128i even, __m128i odd) {
  const __m128i assist = _mm_shuffle_epi32(_mm_aeskeygenassist_si128(even, 0), 0xaa);
  odd = _mm_xor_si128(odd, _mm_slli_si128(odd, 4));
  odd = _mm_xor_si128(odd, _mm_slli_si128(odd, 8));
  return _mm_xor_si128(odd, assist);
}

// The AES key schedules (FIPS 197 section 5.2) with AESKEYGENASSIST.
PS_AES_256 void ExpandKey128(const unsigned char* key, __m128i* rk) {
  rk[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key));
#define PS_ROUND128(i, rcon) rk[i] = Assist128(rk[i - 1], _mm_aeskeygenassist_si128(rk[i - 1], rcon))
  PS_ROUND128(1, 0x01);
  PS_ROUND128(2, 0x02);
  PS_ROUND128(3, 0x04);
  PS_ROUND128(4, 0x08);
  PS_ROUND128(5, 0x10);
  PS_ROUND128(6, 0x20);
  PS_ROUND128(7, 0x40);
  PS_ROUND128(8, 0x80);
  PS_ROUND128(9, 0x1b);
  PS_ROUND128(10, 0x36);
#undef PS_ROUND128
}

PS_AES_256 void ExpandKey256(const unsigned char* key, __m128i* rk) {
  rk[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key));
  rk[1] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key + 16));
#define PS_ROUND256(i, rcon)                                                        \
  rk[i] = Assist128(rk[i - 2], _mm_aeskeygenassist_si128(rk[i - 1], rcon)); \
  if (i + 1 < 15) rk[i + 1] = Assist256Odd(rk[i], rk[i - 1])
  PS_ROUND256(2, 0x01);
  PS_ROUND256(4, 0x02);
  PS_ROUND256(6, 0x04);
  PS_ROUND256(8, 0x08);
  PS_ROUND256(10, 0x10);
  PS_ROUND256(12, 0x20);
  PS_ROUND256(14, 0x40);
#undef PS_ROUND256
}

PS_AES_256 bool SetKeyImpl(const unsigned char* key, size_t key_len, unsigned char* round_keys,
                              unsigned char* powers, int* rounds) {
  __m128i rk[15];
  if (key_len == 16) {
    ExpandKey128(key, rk);
    *rounds = 10;
  } else if (key_len == 32) {
    ExpandKey256(key, rk);
    *rounds = 14;
  } else {
    return false;
  }
  for (int r = 0; r <= *rounds; ++r) {
    _mm_store_si128(reinterpret_cast<__m128i*>(round_keys) + r, rk[r]);
  }
  const __m128i h = Reverse(EncryptBlock(round_keys, *rounds, _mm_setzero_si128()));
  __m128i p = h;
  for (int i = kPowers - 1; i >= 0; --i) {
    _mm_store_si128(reinterpret_cast<__m128i*>(powers) + i, p);
    _mm_store_si128(reinterpret_cast<__m128i*>(powers + kKaratsuba) + i,
                    _mm_xor_si128(p, _mm_shuffle_epi32(p, 0x4e)));
    p = GfMul(p, h);
  }
  OPENSSL_cleanse(rk, sizeof(rk));
  return true;
}

// kRounds rounds of AES on four registers of four blocks each (the rounds unrolled, so that the
// blocks and the round keys stay in registers).
template <int kRounds>
PS_AES_512 inline void Encrypt4x4(const __m512i* rk, __m512i& x0, __m512i& x1, __m512i& x2,
                                     __m512i& x3) {
  x0 = _mm512_xor_si512(x0, rk[0]);
  x1 = _mm512_xor_si512(x1, rk[0]);
  x2 = _mm512_xor_si512(x2, rk[0]);
  x3 = _mm512_xor_si512(x3, rk[0]);
#pragma GCC unroll 16
  for (int r = 1; r < kRounds; ++r) {
    x0 = _mm512_aesenc_epi128(x0, rk[r]);
    x1 = _mm512_aesenc_epi128(x1, rk[r]);
    x2 = _mm512_aesenc_epi128(x2, rk[r]);
    x3 = _mm512_aesenc_epi128(x3, rk[r]);
  }
  x0 = _mm512_aesenclast_epi128(x0, rk[kRounds]);
  x1 = _mm512_aesenclast_epi128(x1, rk[kRounds]);
  x2 = _mm512_aesenclast_epi128(x2, rk[kRounds]);
  x3 = _mm512_aesenclast_epi128(x3, rk[kRounds]);
}

template <int kRounds>
PS_AES_512 inline __m512i Encrypt4(const __m512i* rk, __m512i x) {
  x = _mm512_xor_si512(x, rk[0]);
#pragma GCC unroll 16
  for (int r = 1; r < kRounds; ++r) x = _mm512_aesenc_epi128(x, rk[r]);
  return _mm512_aesenclast_epi128(x, rk[kRounds]);
}

// The whole blocks from counter `counter` on (n > 0; the last block may be partial).
template <int kRounds>
PS_AES_512 void CryptBlocks512(const unsigned char* round_keys, const unsigned char* nonce,
                               uint32_t counter, const unsigned char* in, unsigned char* out,
                               size_t n) {
  __m512i rk[kRounds + 1];
#pragma GCC unroll 16
  for (int r = 0; r <= kRounds; ++r) {
    rk[r] = _mm512_broadcast_i32x4(
        _mm_load_si128(reinterpret_cast<const __m128i*>(round_keys) + r));
  }
  // Each lane holds the nonce and its counter in little-endian order; the shuffle makes the
  // counter big-endian, and 32-bit adds wrap as GCM's inc32 does.
  alignas(16) unsigned char first[16];
  std::memcpy(first, nonce, VectorAesGcm::kNonceBytes);
  std::memcpy(first + 12, &counter, 4);
  __m512i ctr = _mm512_add_epi32(
      _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(first))),
      _mm512_set_epi32(3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0));
  const __m512i to_big_endian =
      _mm512_set4_epi32(0x0c0d0e0f, 0x0b0a0908, 0x07060504, 0x03020100);
  const __m512i four = _mm512_set_epi32(4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0);
  for (; n >= 256; in += 256, out += 256, n -= 256) {
    __m512i x0 = _mm512_shuffle_epi8(ctr, to_big_endian);
    ctr = _mm512_add_epi32(ctr, four);
    __m512i x1 = _mm512_shuffle_epi8(ctr, to_big_endian);
    ctr = _mm512_add_epi32(ctr, four);
    __m512i x2 = _mm512_shuffle_epi8(ctr, to_big_endian);
    ctr = _mm512_add_epi32(ctr, four);
    __m512i x3 = _mm512_shuffle_epi8(ctr, to_big_endian);
    ctr = _mm512_add_epi32(ctr, four);
    Encrypt4x4<kRounds>(rk, x0, x1, x2, x3);
    _mm512_storeu_si512(out, _mm512_xor_si512(x0, _mm512_loadu_si512(in)));
    _mm512_storeu_si512(out + 64, _mm512_xor_si512(x1, _mm512_loadu_si512(in + 64)));
    _mm512_storeu_si512(out + 128, _mm512_xor_si512(x2, _mm512_loadu_si512(in + 128)));
    _mm512_storeu_si512(out + 192, _mm512_xor_si512(x3, _mm512_loadu_si512(in + 192)));
  }
  for (; n > 0; in += 64, out += 64, n -= n < 64 ? n : 64) {
    const __m512i ks = Encrypt4<kRounds>(rk, _mm512_shuffle_epi8(ctr, to_big_endian));
    ctr = _mm512_add_epi32(ctr, four);
    const __mmask64 m = FirstBytes(n);
    _mm512_mask_storeu_epi8(out, m, _mm512_xor_si512(ks, _mm512_maskz_loadu_epi8(m, in)));
  }
}

// The same with 256-bit registers (two blocks each) and without AVX-512: for CPUs with VAES and
// VPCLMULQDQ but not AVX-512 (AMD Zen 3, Intel's client cores). Only 16 vector registers: the
// round keys are read from memory, and tails go through a block on the stack instead of masks.
PS_AES_256 inline __m256i Reverse2(__m256i v) {
  return _mm256_shuffle_epi8(
      v, _mm256_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6,
                         7, 8, 9, 10, 11, 12, 13, 14, 15));
}

PS_AES_256 inline __m128i Xor2(__m256i v) {
  return _mm_xor_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

PS_AES_256 inline void MulAdd2(__m256i x, __m256i h, __m256i hk, __m256i* lo, __m256i* hi,
                               __m256i* mid) {
  *lo = _mm256_xor_si256(*lo, _mm256_clmulepi64_epi128(x, h, 0x00));
  *hi = _mm256_xor_si256(*hi, _mm256_clmulepi64_epi128(x, h, 0x11));
  const __m256i xk = _mm256_xor_si256(x, _mm256_shuffle_epi32(x, 0x4e));
  *mid = _mm256_xor_si256(*mid, _mm256_clmulepi64_epi128(xk, hk, 0x00));
}

PS_AES_256 __m128i Ghash256(const unsigned char* powers, __m128i y, const unsigned char* p,
                            size_t n) {
  const __m256i* h16 = reinterpret_cast<const __m256i*>(powers + 256);  // H^16 .. H^1
  const __m256i* hk16 = reinterpret_cast<const __m256i*>(powers + kKaratsuba + 256);
  for (; n >= 256; p += 256, n -= 256) {
    const __m256i* x = reinterpret_cast<const __m256i*>(p);
    __m256i lo = _mm256_setzero_si256(), hi = lo, mid = lo;
    MulAdd2(_mm256_xor_si256(Reverse2(_mm256_loadu_si256(x)),
                             _mm256_inserti128_si256(_mm256_setzero_si256(), y, 0)),
            _mm256_load_si256(h16), _mm256_load_si256(hk16), &lo, &hi, &mid);
#pragma GCC unroll 8
    for (int j = 1; j < 8; ++j) {
      MulAdd2(Reverse2(_mm256_loadu_si256(x + j)), _mm256_load_si256(h16 + j),
              _mm256_load_si256(hk16 + j), &lo, &hi, &mid);
    }
    y = Fold3(Xor2(lo), Xor2(hi), Xor2(mid));
  }
  const __m128i h = _mm_load_si128(reinterpret_cast<const __m128i*>(powers + 496));
  for (; n >= 16; p += 16, n -= 16) {
    y = GfMul(_mm_xor_si128(Reverse(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), y), h);
  }
  if (n > 0) {
    alignas(16) unsigned char last[16] = {};
    std::memcpy(last, p, n);
    y = GfMul(_mm_xor_si128(Reverse(_mm_load_si128(reinterpret_cast<const __m128i*>(last))), y),
              h);
  }
  return y;
}

template <int kRounds>
PS_AES_256 inline __m256i Encrypt2(const unsigned char* round_keys, __m256i x) {
  const __m128i* rk = reinterpret_cast<const __m128i*>(round_keys);
  x = _mm256_xor_si256(x, _mm256_broadcastsi128_si256(_mm_load_si128(rk)));
#pragma GCC unroll 16
  for (int r = 1; r < kRounds; ++r) {
    x = _mm256_aesenc_epi128(x, _mm256_broadcastsi128_si256(_mm_load_si128(rk + r)));
  }
  return _mm256_aesenclast_epi128(x, _mm256_broadcastsi128_si256(_mm_load_si128(rk + kRounds)));
}

template <int kRounds>
PS_AES_256 void CryptBlocks256(const unsigned char* round_keys, const unsigned char* nonce,
                               uint32_t counter, const unsigned char* in, unsigned char* out,
                               size_t n) {
  const __m128i* rk = reinterpret_cast<const __m128i*>(round_keys);
  alignas(16) unsigned char first[16];
  std::memcpy(first, nonce, VectorAesGcm::kNonceBytes);
  std::memcpy(first + 12, &counter, 4);
  __m256i ctr = _mm256_add_epi32(
      _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(first))),
      _mm256_set_epi32(1, 0, 0, 0, 0, 0, 0, 0));
  const __m256i to_big_endian = _mm256_set_epi8(12, 13, 14, 15, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2,
                                                1, 0, 12, 13, 14, 15, 11, 10, 9, 8, 7, 6, 5, 4,
                                                3, 2, 1, 0);
  const __m256i two = _mm256_set_epi32(2, 0, 0, 0, 2, 0, 0, 0);
  // Eight registers of two blocks in flight: AES's latency is hidden behind seven others.
  for (; n >= 256; in += 256, out += 256, n -= 256) {
    const __m256i k0 = _mm256_broadcastsi128_si256(_mm_load_si128(rk));
#define PS_CTR(i)                                                   \
  __m256i x##i = _mm256_xor_si256(_mm256_shuffle_epi8(ctr, to_big_endian), k0); \
  ctr = _mm256_add_epi32(ctr, two)
    PS_CTR(0);
    PS_CTR(1);
    PS_CTR(2);
    PS_CTR(3);
    PS_CTR(4);
    PS_CTR(5);
    PS_CTR(6);
    PS_CTR(7);
#undef PS_CTR
#pragma GCC unroll 16
    for (int r = 1; r < kRounds; ++r) {
      const __m256i k = _mm256_broadcastsi128_si256(_mm_load_si128(rk + r));
      x0 = _mm256_aesenc_epi128(x0, k);
      x1 = _mm256_aesenc_epi128(x1, k);
      x2 = _mm256_aesenc_epi128(x2, k);
      x3 = _mm256_aesenc_epi128(x3, k);
      x4 = _mm256_aesenc_epi128(x4, k);
      x5 = _mm256_aesenc_epi128(x5, k);
      x6 = _mm256_aesenc_epi128(x6, k);
      x7 = _mm256_aesenc_epi128(x7, k);
    }
    const __m256i last = _mm256_broadcastsi128_si256(_mm_load_si128(rk + kRounds));
#define PS_OUT(i)                                                                          \
  _mm256_storeu_si256(                                                                     \
      reinterpret_cast<__m256i*>(out + 32 * i),                                            \
      _mm256_xor_si256(_mm256_aesenclast_epi128(x##i, last),                               \
                       _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32 * i))))
    PS_OUT(0);
    PS_OUT(1);
    PS_OUT(2);
    PS_OUT(3);
    PS_OUT(4);
    PS_OUT(5);
    PS_OUT(6);
    PS_OUT(7);
#undef PS_OUT
  }
  for (; n > 0; in += 32, out += 32, n -= n < 32 ? n : 32) {
    const __m256i ks = Encrypt2<kRounds>(round_keys, _mm256_shuffle_epi8(ctr, to_big_endian));
    ctr = _mm256_add_epi32(ctr, two);
    if (n >= 32) {
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(out),
          _mm256_xor_si256(ks, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in))));
    } else {
      alignas(32) unsigned char block[32] = {};
      std::memcpy(block, in, n);
      _mm256_store_si256(reinterpret_cast<__m256i*>(block),
                         _mm256_xor_si256(ks, _mm256_load_si256(reinterpret_cast<__m256i*>(block))));
      std::memcpy(out, block, n);
      OPENSSL_cleanse(block, sizeof(block));
    }
  }
}

PS_AES_256 __m128i Ghash(int bits, const unsigned char* powers, __m128i y,
                         const unsigned char* p, size_t n) {
  return bits == 512 ? Ghash512(powers, y, p, n) : Ghash256(powers, y, p, n);
}

PS_AES_256 void CryptImpl(int bits, const unsigned char* round_keys, int rounds,
                          const unsigned char* nonce, size_t pos, const unsigned char* in,
                          unsigned char* out, size_t n) {
  // Block b of the message uses counter 2 + b (counter 1 masks the tag), modulo 2^32.
  uint32_t counter = static_cast<uint32_t>(2 + pos / 16);
  const size_t skip = pos % 16;
  if (skip != 0 && n > 0) {
    alignas(16) unsigned char ks[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(ks),
                    EncryptBlock(round_keys, rounds, CounterBlock(nonce, counter)));
    const size_t take = n < 16 - skip ? n : 16 - skip;
    for (size_t i = 0; i < take; ++i) out[i] = in[i] ^ ks[skip + i];
    OPENSSL_cleanse(ks, sizeof(ks));
    in += take;
    out += take;
    n -= take;
    ++counter;
  }
  if (n == 0) return;
  if (bits == 512) {
    rounds == 10 ? CryptBlocks512<10>(round_keys, nonce, counter, in, out, n)
                 : CryptBlocks512<14>(round_keys, nonce, counter, in, out, n);
  } else {
    rounds == 10 ? CryptBlocks256<10>(round_keys, nonce, counter, in, out, n)
                 : CryptBlocks256<14>(round_keys, nonce, counter, in, out, n);
  }
}

PS_AES_256 void TagImpl(int bits, const unsigned char* round_keys, int rounds,
                        const unsigned char* powers, const unsigned char* nonce,
                        const unsigned char* aad, size_t aad_len, const unsigned char* ct,
                        size_t ct_len, unsigned char* tag) {
  __m128i y = Ghash(bits, powers, _mm_setzero_si128(), aad, aad_len);
  y = Ghash(bits, powers, y, ct, ct_len);
  alignas(16) unsigned char lengths[16];
  const uint64_t length_bits[2] = {uint64_t{aad_len} * 8, uint64_t{ct_len} * 8};
  for (int half = 0; half < 2; ++half) {
    for (int b = 0; b < 8; ++b) {
      lengths[8 * half + b] = static_cast<unsigned char>(length_bits[half] >> (56 - 8 * b));
    }
  }
  y = Ghash(bits, powers, y, lengths, 16);
  const __m128i mask = EncryptBlock(round_keys, rounds, CounterBlock(nonce, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(tag), _mm_xor_si128(Reverse(y), mask));
}

}  // namespace

bool VectorAesGcm::SetKey(const unsigned char* key, size_t key_len) {
  return Supports(bits_) && SetKeyImpl(key, key_len, round_keys_, h_powers_, &rounds_);
}

void VectorAesGcm::Crypt(const unsigned char* nonce, size_t pos, const unsigned char* in,
                         unsigned char* out, size_t n) const {
  CryptImpl(bits_, round_keys_, rounds_, nonce, pos, in, out, n);
}

void VectorAesGcm::Tag(const unsigned char* nonce, const unsigned char* aad, size_t aad_len,
                       const unsigned char* ct, size_t ct_len, unsigned char* tag) const {
  TagImpl(bits_, round_keys_, rounds_, h_powers_, nonce, aad, aad_len, ct, ct_len, tag);
}

#else  // Not x86-64: never supported; OpenSSL does the work.

bool VectorAesGcm::Supports(int) { return false; }
bool VectorAesGcm::Supported() { return false; }
VectorAesGcm::VectorAesGcm(int bits) : bits_(bits) {}
bool VectorAesGcm::SetKey(const unsigned char*, size_t) { return false; }
void VectorAesGcm::Crypt(const unsigned char*, size_t, const unsigned char*, unsigned char*,
                         size_t) const {}
void VectorAesGcm::Tag(const unsigned char*, const unsigned char*, size_t, const unsigned char*,
                       size_t, unsigned char*) const {}

#endif

}  // namespace pscluster
