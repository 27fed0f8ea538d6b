// CudaBackend: bias, column sums, block copies, activations and half casts.
#include "kernels/cuda/cuda_backend_impl.h"
#include "common/half_bits.h"

namespace pscluster::kernels {
namespace cuda {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

bool Aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

__device__ inline int64_t GlobalThread() { return blockIdx.x * int64_t{blockDim.x} + threadIdx.x; }
__device__ inline int64_t GridThreads() { return int64_t{gridDim.x} * blockDim.x; }

struct ReluForward {
  __device__ float operator()(float x) const { return x < 0.0f ? 0.0f : x; }  // NaN passes.
};
struct GeluForward {
  // 0.5 x (1 + erf(x / sqrt 2)) == 0.5 x erfc(-x / sqrt 2), without cancellation for x << 0.
  __device__ float operator()(float x) const { return 0.5f * x * erfcf(-x * kInvSqrt2); }
};
struct ReluBackward {
  __device__ float operator()(float x, float dy) const { return x > 0.0f ? dy : 0.0f; }
};
struct GeluBackward {
  __device__ float operator()(float x, float dy) const {
    const float cdf = 0.5f * erfcf(-x * kInvSqrt2);
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return dy * (cdf + x * pdf);
  }
};

// y = op(x) over n floats; four at a time when vec4 (x and y 16-byte aligned).
template <typename Op>
__global__ void UnaryKernel(int64_t n, const float* x, float* y, bool vec4, Op op) {
  int64_t start = 0;
  if (vec4) {
    const int64_t n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (int64_t i = GlobalThread(); i < n4; i += GridThreads()) {
      float4 v = x4[i];
      v.x = op(v.x);
      v.y = op(v.y);
      v.z = op(v.z);
      v.w = op(v.w);
      y4[i] = v;
    }
    start = n4 * 4;
  }
  for (int64_t i = start + GlobalThread(); i < n; i += GridThreads()) y[i] = op(x[i]);
}

// dx = op(x, dy) over n floats.
template <typename Op>
__global__ void BinaryKernel(int64_t n, const float* x, const float* dy, float* dx, bool vec4,
                             Op op) {
  int64_t start = 0;
  if (vec4) {
    const int64_t n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* d4 = reinterpret_cast<const float4*>(dy);
    float4* o4 = reinterpret_cast<float4*>(dx);
    for (int64_t i = GlobalThread(); i < n4; i += GridThreads()) {
      const float4 v = x4[i];
      const float4 d = d4[i];
      o4[i] = make_float4(op(v.x, d.x), op(v.y, d.y), op(v.z, d.z), op(v.w, d.w));
    }
    start = n4 * 4;
  }
  for (int64_t i = start + GlobalThread(); i < n; i += GridThreads()) dx[i] = op(x[i], dy[i]);
}

// y[i] = x[i] + bias[i % cols]; I is the index type (int32 when everything fits).
template <typename I>
__global__ void AddBiasKernel(I n, I cols, const float* x, const float* bias, float* y) {
  for (I i = static_cast<I>(GlobalThread()); i < n; i += static_cast<I>(GridThreads())) {
    y[i] = x[i] + bias[i % cols];
  }
}

// The same, four columns at a time (cols % 4 == 0, all pointers 16-byte aligned).
template <typename I>
__global__ void AddBiasVec4Kernel(I n4, I cols4, const float4* x, const float4* bias, float4* y) {
  for (I i = static_cast<I>(GlobalThread()); i < n4; i += static_cast<I>(GridThreads())) {
    const float4 v = x[i];
    const float4 b = bias[i % cols4];
    y[i] = make_float4(v.x + b.x, v.y + b.y, v.z + b.z, v.w + b.w);
  }
}

// dst[r * dst_stride + c] (+)= src[r * src_stride + c] over total = rows * cols elements.
template <typename I>
__global__ void CopyBlockKernel(I total, I cols, const float* src, I src_stride, float* dst,
                                I dst_stride, bool accumulate) {
  for (I e = static_cast<I>(GlobalThread()); e < total; e += static_cast<I>(GridThreads())) {
    const I r = e / cols;
    const I c = e - r * cols;
    const float v = src[r * src_stride + c];
    float* d = dst + r * dst_stride + c;
    *d = accumulate ? *d + v : v;
  }
}

// Column sums, phase 1: block (32, 8) sums 32 columns over one chunk of rows. With one chunk it
// writes `out` directly; otherwise partial[chunk * cols + col].
__global__ void ColumnSumPartialKernel(int64_t rows, int64_t cols, int64_t rows_per_chunk,
                                       const float* x, bool accumulate, float* out,
                                       float* partial) {
  __shared__ float sums[8][33];
  const int64_t col = blockIdx.x * int64_t{32} + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc = 0.0f;
  if (col < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += x[r * cols + col];
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float s = 0.0f;
    for (int j = 0; j < 8; ++j) s += sums[j][threadIdx.x];
    if (gridDim.y == 1) {
      out[col] = accumulate ? out[col] + s : s;
    } else {
      partial[blockIdx.y * cols + col] = s;
    }
  }
}

// Phase 2: out[col] (+)= sum of the chunks' partial sums, in chunk order.
__global__ void ColumnSumFinalizeKernel(int64_t chunks, int64_t cols, const float* partial,
                                        bool accumulate, float* out) {
  for (int64_t col = GlobalThread(); col < cols; col += GridThreads()) {
    float s = accumulate ? out[col] : 0.0f;
    for (int64_t c = 0; c < chunks; ++c) s += partial[c * cols + col];
    out[col] = s;
  }
}

__global__ void ToHalfKernel(int64_t n, const float* x, uint16_t* y, bool bf16, bool vec4) {
  int64_t start = 0;
  if (vec4) {  // x 16-byte and y 8-byte aligned.
    const int64_t n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    uint2* y4 = reinterpret_cast<uint2*>(y);
    for (int64_t i = GlobalThread(); i < n4; i += GridThreads()) {
      const float4 v = x4[i];
      uint32_t a, b, c, d;
      if (bf16) {
        a = FloatToBFloat16Bits(v.x), b = FloatToBFloat16Bits(v.y);
        c = FloatToBFloat16Bits(v.z), d = FloatToBFloat16Bits(v.w);
      } else {
        a = FloatToHalfBits(v.x), b = FloatToHalfBits(v.y);
        c = FloatToHalfBits(v.z), d = FloatToHalfBits(v.w);
      }
      y4[i] = make_uint2(a | (b << 16), c | (d << 16));
    }
    start = n4 * 4;
  }
  for (int64_t i = start + GlobalThread(); i < n; i += GridThreads()) {
    y[i] = bf16 ? FloatToBFloat16Bits(x[i]) : FloatToHalfBits(x[i]);
  }
}

__global__ void FromHalfKernel(int64_t n, const uint16_t* x, float* y, bool bf16, bool vec4) {
  int64_t start = 0;
  if (vec4) {
    const int64_t n4 = n / 4;
    const uint2* x4 = reinterpret_cast<const uint2*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (int64_t i = GlobalThread(); i < n4; i += GridThreads()) {
      const uint2 v = x4[i];
      const uint16_t h[4] = {static_cast<uint16_t>(v.x), static_cast<uint16_t>(v.x >> 16),
                             static_cast<uint16_t>(v.y), static_cast<uint16_t>(v.y >> 16)};
      float f[4];
      for (int j = 0; j < 4; ++j) f[j] = bf16 ? BFloat16BitsToFloat(h[j]) : HalfBitsToFloat(h[j]);
      y4[i] = make_float4(f[0], f[1], f[2], f[3]);
    }
    start = n4 * 4;
  }
  for (int64_t i = start + GlobalThread(); i < n; i += GridThreads()) {
    y[i] = bf16 ? BFloat16BitsToFloat(x[i]) : HalfBitsToFloat(x[i]);
  }
}

}  // namespace
}  // namespace cuda

using cuda::Aligned;
using cuda::GridFor;
using cuda::kThreads;

absl::Status CudaBackend::DoAddBias(int64_t rows, int64_t cols, const float* x, const float* bias,
                                    float* y) {
  KERNELS_CUDA_ACTIVATE();
  const int64_t n = rows * cols;
  const bool vec4 = cols % 4 == 0 && Aligned(x, 16) && Aligned(bias, 16) && Aligned(y, 16);
  const unsigned grid = GridFor(vec4 ? n / 4 : n, sm_count_);
  if (n < cuda::kInt32IndexLimit) {
    if (vec4) {
      cuda::AddBiasVec4Kernel<int32_t><<<grid, kThreads, 0, stream_>>>(
          static_cast<int32_t>(n / 4), static_cast<int32_t>(cols / 4),
          reinterpret_cast<const float4*>(x), reinterpret_cast<const float4*>(bias),
          reinterpret_cast<float4*>(y));
    } else {
      cuda::AddBiasKernel<int32_t><<<grid, kThreads, 0, stream_>>>(
          static_cast<int32_t>(n), static_cast<int32_t>(cols), x, bias, y);
    }
  } else {
    cuda::AddBiasKernel<int64_t><<<grid, kThreads, 0, stream_>>>(n, cols, x, bias, y);
  }
  CUDA_RETURN_IF_LAUNCH_FAILED("AddBiasKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoColumnSum(int64_t rows, int64_t cols, const float* x, bool accumulate,
                                      float* out) {
  KERNELS_CUDA_ACTIVATE();
  const int64_t col_blocks = (cols + 31) / 32;
  // Enough row chunks to give every SM a few blocks, each chunk at least 64 rows.
  const int64_t want = (4 * int64_t{sm_count_} + col_blocks - 1) / col_blocks;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>({want, (rows + 63) / 64, 65535}));
  const int64_t per_chunk = (rows + chunks - 1) / chunks;
  float* partial = nullptr;
  if (chunks > 1) {
    KERNELS_ASSIGN_OR_RETURN(void* s, Scratch(sizeof(float) * chunks * cols));
    partial = static_cast<float*>(s);
  }
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks));
  cuda::ColumnSumPartialKernel<<<grid, dim3(32, 8), 0, stream_>>>(rows, cols, per_chunk, x,
                                                                  accumulate, out, partial);
  CUDA_RETURN_IF_LAUNCH_FAILED("ColumnSumPartialKernel");
  if (chunks > 1) {
    cuda::ColumnSumFinalizeKernel<<<GridFor(cols, sm_count_), kThreads, 0, stream_>>>(
        chunks, cols, partial, accumulate, out);
    CUDA_RETURN_IF_LAUNCH_FAILED("ColumnSumFinalizeKernel");
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::DoActivationForward(Activation f, int64_t n, const float* x, float* y) {
  KERNELS_CUDA_ACTIVATE();
  const bool vec4 = Aligned(x, 16) && Aligned(y, 16);
  const unsigned grid = GridFor(vec4 ? (n + 3) / 4 : n, sm_count_);
  if (f == Activation::kRelu) {
    cuda::UnaryKernel<<<grid, kThreads, 0, stream_>>>(n, x, y, vec4, cuda::ReluForward());
  } else {
    cuda::UnaryKernel<<<grid, kThreads, 0, stream_>>>(n, x, y, vec4, cuda::GeluForward());
  }
  CUDA_RETURN_IF_LAUNCH_FAILED("UnaryKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoActivationBackward(Activation f, int64_t n, const float* x,
                                               const float* dy, float* dx) {
  KERNELS_CUDA_ACTIVATE();
  const bool vec4 = Aligned(x, 16) && Aligned(dy, 16) && Aligned(dx, 16);
  const unsigned grid = GridFor(vec4 ? (n + 3) / 4 : n, sm_count_);
  if (f == Activation::kRelu) {
    cuda::BinaryKernel<<<grid, kThreads, 0, stream_>>>(n, x, dy, dx, vec4, cuda::ReluBackward());
  } else {
    cuda::BinaryKernel<<<grid, kThreads, 0, stream_>>>(n, x, dy, dx, vec4, cuda::GeluBackward());
  }
  CUDA_RETURN_IF_LAUNCH_FAILED("BinaryKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoCastToHalf(HalfType type, int64_t n, const float* x, uint16_t* y) {
  KERNELS_CUDA_ACTIVATE();
  const bool vec4 = Aligned(x, 16) && Aligned(y, 8);
  cuda::ToHalfKernel<<<GridFor(vec4 ? (n + 3) / 4 : n, sm_count_), kThreads, 0, stream_>>>(
      n, x, y, type == HalfType::kBFloat16, vec4);
  CUDA_RETURN_IF_LAUNCH_FAILED("ToHalfKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoCastFromHalf(HalfType type, int64_t n, const uint16_t* x, float* y) {
  KERNELS_CUDA_ACTIVATE();
  const bool vec4 = Aligned(x, 8) && Aligned(y, 16);
  cuda::FromHalfKernel<<<GridFor(vec4 ? (n + 3) / 4 : n, sm_count_), kThreads, 0, stream_>>>(
      n, x, y, type == HalfType::kBFloat16, vec4);
  CUDA_RETURN_IF_LAUNCH_FAILED("FromHalfKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoCopyBlock(int64_t rows, int64_t cols, const float* src,
                                      int64_t src_stride, float* dst, int64_t dst_stride,
                                      bool accumulate) {
  KERNELS_CUDA_ACTIVATE();
  const int64_t total = rows * cols;
  const int64_t reach = (rows - 1) * std::max(src_stride, dst_stride) + cols;
  const unsigned grid = GridFor(total, sm_count_);
  if (reach < cuda::kInt32IndexLimit) {
    cuda::CopyBlockKernel<int32_t><<<grid, kThreads, 0, stream_>>>(
        static_cast<int32_t>(total), static_cast<int32_t>(cols), src,
        static_cast<int32_t>(src_stride), dst, static_cast<int32_t>(dst_stride), accumulate);
  } else {
    cuda::CopyBlockKernel<int64_t><<<grid, kThreads, 0, stream_>>>(
        total, cols, src, src_stride, dst, dst_stride, accumulate);
  }
  CUDA_RETURN_IF_LAUNCH_FAILED("CopyBlockKernel");
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
