// Gradient compression of dense pushes: top-k selection by magnitude and int8 quantization with
// one scale per group of values. Pure functions (thread-safe, no I/O); the worker's error
// feedback (server/client/error_feedback.h) calls them, the servers dequantize with them.
#ifndef PSCLUSTER_COMMON_GRAD_COMPRESS_H_
#define PSCLUSTER_COMMON_GRAD_COMPRESS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pscluster {

// Values per int8 scale (PushChunk.scale_group as workers send it).
inline constexpr uint32_t kInt8ScaleGroup = 256;

// How many of a block's `n` elements a top-k push with `ratio` (0 < ratio < 1) sends:
// ceil(ratio * n), at least 1, at most n. The same for every attempt of a push, so that a
// retried push's chunks have the same identity on the servers.
uint64_t TopKCount(uint64_t n, float ratio);

// Indices (ascending) of the `k` elements of x[0, n) of largest |x|; ties go to the lower index.
// NaN ranks above every number. REQUIRES: k <= n. Large x and small k take a threshold guessed
// on a sample and one vector pass (with AVX2); otherwise, or when the guess does not hold, the
// radix select below. Both give the same indices.
std::vector<uint32_t> SelectTopK(const float* x, uint64_t n, uint64_t k);
// The same by a radix select over the magnitudes' bits (three passes), for any x.
std::vector<uint32_t> SelectTopKRadix(const float* x, uint64_t n, uint64_t k);

// Number of scales for n values in groups of `group`.
inline size_t NumScaleGroups(size_t n, size_t group) { return (n + group - 1) / group; }

// Quantizes x[0, n) to int8: per group of `group` values, scale = max|x| / 127 (0 for an
// all-zero group) and q = round-to-nearest(x / scale) in [-127, 127]. `scales` receives
// NumScaleGroups(n, group) floats. A non-finite value makes its group's scale non-finite, which
// the servers refuse (the worker checks its gradients before pushing).
void QuantizeInt8(const float* x, size_t n, size_t group, int8_t* q, float* scales);
// out[i] = q[i] * scales[i / group].
void DequantizeInt8(const int8_t* q, size_t n, size_t group, const float* scales, float* out);
// QuantizeInt8 / DequantizeInt8 use AVX2 where the CPU has it and give the same bits as these
// element-by-element reference versions, which they use elsewhere. No alignment needed.
void QuantizeInt8Scalar(const float* x, size_t n, size_t group, int8_t* q, float* scales);
void DequantizeInt8Scalar(const int8_t* q, size_t n, size_t group, const float* scales,
                          float* out);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_GRAD_COMPRESS_H_
