// x86-64 vector kernels behind the transport codecs (common/dtype.h's fp16 conversion,
// common/grad_compress.h's int8 quantization), compiled for AVX2 + F16C with function target
// attributes so that the binaries still run on CPUs without them: callers check
// CpuHasAvx2F16C() first and otherwise use the scalar reference code. Every kernel gives the
// scalar reference's bits (common/half_bits.h, QuantizeInt8Scalar / DequantizeInt8Scalar);
// common/dtype_test.cc and common/grad_compress_test.cc check that, the edge cases included.
#ifndef PSCLUSTER_COMMON_CODEC_SIMD_H_
#define PSCLUSTER_COMMON_CODEC_SIMD_H_

#include <cstddef>
#include <cstdint>

namespace pscluster::codec_simd {

// Whether this CPU runs the kernels below (AVX2 and F16C; false off x86-64). Cached.
bool CpuHasAvx2F16C();

// REQUIRES for all of these: CpuHasAvx2F16C(). No alignment required.
// float32 -> float16, round to nearest even (FloatToHalfBits element by element).
void FloatsToHalf(const float* in, size_t n, uint16_t* out);
// float16 -> float32 (HalfBitsToFloat element by element, signaling NaNs kept signaling).
void HalfToFloats(const uint16_t* in, size_t n, float* out);
// The largest AbsKey (|x| as bits) of x[0, n); 0 for n == 0.
uint32_t MaxAbsKey(const float* x, size_t n);
// q[i] = clamp(nearbyint(x[i] * inv), -127, 127). REQUIRES: inv finite and every x[i] * inv
// finite (|x[i]| * inv <= 127 give or take rounding), as for a group whose scale is finite and
// positive and whose 1 / scale is finite.
void QuantizeInt8Group(const float* x, size_t n, float inv, int8_t* q);
// out[i] = q[i] * scale.
void DequantizeInt8Group(const int8_t* q, size_t n, float scale, float* out);
// The indices i (ascending) of x[0, n) whose AbsKey is at least `t`, written to out[0, cap):
// returns how many there are, or cap + 1 as soon as there are more than `cap` (out then holds
// cap of them). REQUIRES: 0 < t <= 0x7fffffff; n < 2^32.
size_t CollectAbsKeysAtLeast(const float* x, size_t n, uint32_t t, uint32_t* out, size_t cap);

}  // namespace pscluster::codec_simd

#endif  // PSCLUSTER_COMMON_CODEC_SIMD_H_
