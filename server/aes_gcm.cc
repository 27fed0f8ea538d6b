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

// Every function that uses the instructions carries this target; nothing in the file is compiled
// for them otherwise, so the code runs on any x86-64 until Supported() is asked.
#define PS_VECTOR_AES \
  __attribute__((target("aes,pclmul,avx2,avx512f,avx512bw,avx512vl,vaes,vpclmulqdq")))

bool VectorAesGcm::Supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul") &&
         __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("vaes") && __builtin_cpu_supports("vpclmulqdq");
}

namespace {

// Reverses the bytes of each 128-bit lane: GHASH works on the blocks byte-reversed, so that the
// carry-less multiply sees GCM's bit order (Gueron and Kounavis, "Intel Carry-Less
// Multiplication Instruction and its Usage for Computing the GCM Mode", algorithm 5).
PS_VECTOR_AES inline __m128i Reverse(__m128i v) {
  return _mm_shuffle_epi8(v, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

PS_VECTOR_AES inline __m512i Reverse4(__m512i v) {
  return _mm512_shuffle_epi8(
      v, _mm512_set4_epi32(0x00010203, 0x04050607, 0x08090a0b, 0x0c0d0e0f));
}

// The 256-bit product lo + hi * x^128 of two byte-reversed elements, shifted left by one bit and
// reduced modulo x^128 + x^127 + x^126 + x^121 + 1 (in the reflected order): the GCM product.
PS_VECTOR_AES inline __m128i Reduce(__m128i lo, __m128i hi) {
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
PS_VECTOR_AES inline __m128i Fold(__m128i lo, __m128i hi, __m128i mid) {
  lo = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
  hi = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
  return Reduce(lo, hi);
}

PS_VECTOR_AES inline __m128i GfMul(__m128i a, __m128i b) {
  const __m128i lo = _mm_clmulepi64_si128(a, b, 0x00);
  const __m128i hi = _mm_clmulepi64_si128(a, b, 0x11);
  const __m128i mid =
      _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01), _mm_clmulepi64_si128(a, b, 0x10));
  return Fold(lo, hi, mid);
}

// The XOR of a register's four 128-bit lanes.
PS_VECTOR_AES inline __m128i Xor4(__m512i v) {
  const __m256i a =
      _mm256_xor_si256(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  return _mm_xor_si128(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
}

// Adds the four lanes' products of x and h to lo, hi and mid.
PS_VECTOR_AES inline void MulAdd(__m512i x, __m512i h, __m512i* lo, __m512i* hi, __m512i* mid) {
  *lo = _mm512_xor_si512(*lo, _mm512_clmulepi64_epi128(x, h, 0x00));
  *hi = _mm512_xor_si512(*hi, _mm512_clmulepi64_epi128(x, h, 0x11));
  *mid = _mm512_xor_si512(*mid, _mm512_xor_si512(_mm512_clmulepi64_epi128(x, h, 0x01),
                                                 _mm512_clmulepi64_epi128(x, h, 0x10)));
}

PS_VECTOR_AES inline __m512i InLane0(__m128i v) {
  return _mm512_inserti32x4(_mm512_setzero_si512(), v, 0);
}

PS_VECTOR_AES inline __mmask64 FirstBytes(size_t n) {
  return n >= 64 ? ~__mmask64{0} : ((__mmask64{1} << n) - 1);
}

constexpr int kPowers = 32;

// GHASH of `n` bytes (the last block zero-padded) on from the byte-reversed state y.
PS_VECTOR_AES __m128i Ghash(const unsigned char* powers, __m128i y, const unsigned char* p,
                            size_t n) {
  if (n >= 512) {
    __m512i h[8];
    for (int j = 0; j < 8; ++j) h[j] = _mm512_load_si512(powers + 64 * j);
    for (; n >= 512; p += 512, n -= 512) {
      __m512i lo = _mm512_setzero_si512(), hi = lo, mid = lo;
      MulAdd(_mm512_xor_si512(Reverse4(_mm512_loadu_si512(p)), InLane0(y)), h[0], &lo, &hi,
             &mid);
#pragma GCC unroll 8
      for (int j = 1; j < 8; ++j) {
        MulAdd(Reverse4(_mm512_loadu_si512(p + 64 * j)), h[j], &lo, &hi, &mid);
      }
      y = Fold(Xor4(lo), Xor4(hi), Xor4(mid));
    }
  }
  const __m512i h4 = _mm512_load_si512(powers + 448);  // H^4 .. H^1
  for (; n >= 64; p += 64, n -= 64) {
    __m512i lo = _mm512_setzero_si512(), hi = lo, mid = lo;
    MulAdd(_mm512_xor_si512(Reverse4(_mm512_loadu_si512(p)), InLane0(y)), h4, &lo, &hi, &mid);
    y = Fold(Xor4(lo), Xor4(hi), Xor4(mid));
  }
  const __m128i h = _mm_load_si128(reinterpret_cast<const __m128i*>(powers + 496));
  for (; n > 0; p += 16, n -= n < 16 ? n : 16) {
    const __m128i b = _mm_maskz_loadu_epi8(static_cast<__mmask16>(FirstBytes(n < 16 ? n : 16)), p);
    y = GfMul(_mm_xor_si128(Reverse(b), y), h);
  }
  return y;
}

PS_VECTOR_AES inline __m128i EncryptBlock(const unsigned char* round_keys, int rounds, __m128i b) {
  const __m128i* rk = reinterpret_cast<const __m128i*>(round_keys);
  b = _mm_xor_si128(b, _mm_load_si128(rk));
  for (int r = 1; r < rounds; ++r) b = _mm_aesenc_si128(b, _mm_load_si128(rk + r));
  return _mm_aesenclast_si128(b, _mm_load_si128(rk + rounds));
}

// The counter block of `nonce` and block counter `counter` (big-endian in the last four bytes).
PS_VECTOR_AES inline __m128i CounterBlock(const unsigned char* nonce, uint32_t counter) {
  alignas(16) unsigned char block[16];
  std::memcpy(block, nonce, VectorAesGcm::kNonceBytes);
  block[12] = static_cast<unsigned char>(counter >> 24);
  block[13] = static_cast<unsigned char>(counter >> 16);
  block[14] = static_cast<unsigned char>(counter >> 8);
  block[15] = static_cast<unsigned char>(counter);
  return _mm_load_si128(reinterpret_cast<const __m128i*>(block));
}

PS_VECTOR_AES inline __m128i Assist128(__m128i key, __m128i assist) {
  assist = _mm_shuffle_epi32(assist, 0xff);
  key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
  key = _mm_xor_si128(key, _mm_slli_si128(key, 8));
  return _mm_xor_si128(key, assist);
}

PS_VECTOR_AES inline __m128i Assist256Odd(__m128i even, __m128i odd) {
  const __m128i assist = _mm_shuffle_epi32(_mm_aeskeygenassist_si128(even, 0), 0xaa);
  odd = _mm_xor_si128(odd, _mm_slli_si128(odd, 4));
  odd = _mm_xor_si128(odd, _mm_slli_si128(odd, 8));
  return _mm_xor_si128(odd, assist);
}

// The AES key schedules (FIPS 197 section 5.2) with AESKEYGENASSIST.
PS_VECTOR_AES void ExpandKey128(const unsigned char* key, __m128i* rk) {
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

PS_VECTOR_AES void ExpandKey256(const unsigned char* key, __m128i* rk) {
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

PS_VECTOR_AES bool SetKeyImpl(const unsigned char* key, size_t key_len, unsigned char* round_keys,
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
    p = GfMul(p, h);
  }
  OPENSSL_cleanse(rk, sizeof(rk));
  return true;
}

// kRounds rounds of AES on four registers of four blocks each (the rounds unrolled, so that the
// blocks and the round keys stay in registers).
template <int kRounds>
PS_VECTOR_AES inline void Encrypt4x4(const __m512i* rk, __m512i& x0, __m512i& x1, __m512i& x2,
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
PS_VECTOR_AES inline __m512i Encrypt4(const __m512i* rk, __m512i x) {
  x = _mm512_xor_si512(x, rk[0]);
#pragma GCC unroll 16
  for (int r = 1; r < kRounds; ++r) x = _mm512_aesenc_epi128(x, rk[r]);
  return _mm512_aesenclast_epi128(x, rk[kRounds]);
}

// The whole blocks from counter `counter` on (n > 0; the last block may be partial).
template <int kRounds>
PS_VECTOR_AES void CryptBlocks(const unsigned char* round_keys, const unsigned char* nonce,
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

PS_VECTOR_AES void CryptImpl(const unsigned char* round_keys, int rounds,
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
  if (rounds == 10) {
    CryptBlocks<10>(round_keys, nonce, counter, in, out, n);
  } else {
    CryptBlocks<14>(round_keys, nonce, counter, in, out, n);
  }
}

PS_VECTOR_AES void TagImpl(const unsigned char* round_keys, int rounds, const unsigned char* powers,
                           const unsigned char* nonce, const unsigned char* aad, size_t aad_len,
                           const unsigned char* ct, size_t ct_len, unsigned char* tag) {
  __m128i y = Ghash(powers, _mm_setzero_si128(), aad, aad_len);
  y = Ghash(powers, y, ct, ct_len);
  alignas(16) unsigned char lengths[16];
  const uint64_t bits[2] = {uint64_t{aad_len} * 8, uint64_t{ct_len} * 8};
  for (int half = 0; half < 2; ++half) {
    for (int b = 0; b < 8; ++b) lengths[8 * half + b] = static_cast<unsigned char>(bits[half] >> (56 - 8 * b));
  }
  y = Ghash(powers, y, lengths, 16);
  const __m128i mask = EncryptBlock(round_keys, rounds, CounterBlock(nonce, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(tag), _mm_xor_si128(Reverse(y), mask));
}

}  // namespace

bool VectorAesGcm::SetKey(const unsigned char* key, size_t key_len) {
  return SetKeyImpl(key, key_len, round_keys_, h_powers_, &rounds_);
}

void VectorAesGcm::Crypt(const unsigned char* nonce, size_t pos, const unsigned char* in,
                         unsigned char* out, size_t n) const {
  CryptImpl(round_keys_, rounds_, nonce, pos, in, out, n);
}

void VectorAesGcm::Tag(const unsigned char* nonce, const unsigned char* aad, size_t aad_len,
                       const unsigned char* ct, size_t ct_len, unsigned char* tag) const {
  TagImpl(round_keys_, rounds_, h_powers_, nonce, aad, aad_len, ct, ct_len, tag);
}

#else  // Not x86-64: never supported; OpenSSL does the work.

bool VectorAesGcm::Supported() { return false; }
bool VectorAesGcm::SetKey(const unsigned char*, size_t) { return false; }
void VectorAesGcm::Crypt(const unsigned char*, size_t, const unsigned char*, unsigned char*,
                         size_t) const {}
void VectorAesGcm::Tag(const unsigned char*, const unsigned char*, size_t, const unsigned char*,
                       size_t, unsigned char*) const {}

#endif

}  // namespace pscluster
