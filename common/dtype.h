// Element types of raw tensor bytes and the float32 <-> float16 / bfloat16 conversions used for
// transport compression. Conversions round to nearest even; NaN stays NaN, overflow to fp16
// becomes infinity.
#ifndef PSCLUSTER_COMMON_DTYPE_H_
#define PSCLUSTER_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "proto/common.pb.h"

namespace pscluster {

// Bytes per element; 0 for DT_INVALID and unknown values.
size_t DTypeSize(v1::DataType dtype);
std::string_view DTypeName(v1::DataType dtype);

uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBFloat16(float f);
float BFloat16ToFloat(uint16_t b);

// Converts n float32 values to `dtype` (FLOAT32, FLOAT16 or BFLOAT16) into out, which must hold
// n * DTypeSize(dtype) bytes.
void EncodeFloats(const float* in, size_t n, v1::DataType dtype, void* out);
// The inverse: n values of `dtype` at `in` to float32.
void DecodeFloats(const void* in, size_t n, v1::DataType dtype, float* out);
// EncodeFloats / DecodeFloats pick vector code at run time where the CPU has it (AVX2 + F16C on
// x86-64; bfloat16 also AVX-512) and give the same bits as these element-by-element reference
// versions, which they use elsewhere. Neither pointer needs any alignment.
void EncodeFloatsScalar(const float* in, size_t n, v1::DataType dtype, void* out);
void DecodeFloatsScalar(const void* in, size_t n, v1::DataType dtype, float* out);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_DTYPE_H_
