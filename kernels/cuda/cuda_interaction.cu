// CudaBackend: feature interactions over x [rows, vectors, width]. The factorization machine
// runs one warp per row (lanes across the width, a fixed reduction order); the dot interaction
// one thread per output element. No atomics: results do not depend on scheduling.
#include <cmath>

#include "kernels/cuda/cuda_backend_impl.h"

namespace pscluster::kernels {
namespace cuda {
namespace {

__device__ inline int64_t GlobalThread() { return blockIdx.x * int64_t{blockDim.x} + threadIdx.x; }
__device__ inline int64_t GridThreads() { return int64_t{gridDim.x} * blockDim.x; }

// Every lane of a warp runs the same rows (the row depends on the warp only), so the shuffles see
// all 32 lanes.
__global__ void FmForwardKernel(int64_t rows, int64_t vectors, int64_t width, const float* x,
                                float* out) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = GridThreads() >> 5;
  for (int64_t r = GlobalThread() >> 5; r < rows; r += warps) {
    const float* xr = x + r * vectors * width;
    float acc = 0.0f;
    for (int64_t k = lane; k < width; k += 32) {
      float s = 0.0f, q = 0.0f;
      for (int64_t a = 0; a < vectors; ++a) {
        const float v = xr[a * width + k];
        s += v;
        q += v * v;
      }
      acc += s * s - q;
    }
    for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) out[r] = 0.5f * acc;
  }
}

__global__ void FmBackwardKernel(int64_t rows, int64_t vectors, int64_t width, const float* x,
                                 const float* dout, float* dx) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = GridThreads() >> 5;
  for (int64_t r = GlobalThread() >> 5; r < rows; r += warps) {
    const float* xr = x + r * vectors * width;
    float* dr = dx + r * vectors * width;
    const float g = dout[r];
    for (int64_t k = lane; k < width; k += 32) {
      float s = 0.0f;
      for (int64_t a = 0; a < vectors; ++a) s += xr[a * width + k];
      for (int64_t a = 0; a < vectors; ++a) dr[a * width + k] = g * (s - xr[a * width + k]);
    }
  }
}

// The pair (a, b), a > b, at position p = a (a - 1) / 2 + b.
__device__ inline void PairOf(int64_t p, int64_t* a, int64_t* b) {
  int64_t i = static_cast<int64_t>((1.0 + sqrt(8.0 * static_cast<double>(p) + 1.0)) / 2.0);
  while (i * (i - 1) / 2 > p) --i;
  while ((i + 1) * i / 2 <= p) ++i;
  *a = i;
  *b = p - i * (i - 1) / 2;
}

__device__ inline int64_t PairIndex(int64_t a, int64_t b) {
  return a > b ? a * (a - 1) / 2 + b : b * (b - 1) / 2 + a;
}

__global__ void DotForwardKernel(int64_t rows, int64_t vectors, int64_t width, const float* x,
                                 float* out) {
  const int64_t pairs = vectors * (vectors - 1) / 2;
  const int64_t total = rows * pairs;
  for (int64_t e = GlobalThread(); e < total; e += GridThreads()) {
    const int64_t r = e / pairs;
    int64_t a, b;
    PairOf(e - r * pairs, &a, &b);
    const float* xa = x + (r * vectors + a) * width;
    const float* xb = x + (r * vectors + b) * width;
    float dot = 0.0f;
    for (int64_t k = 0; k < width; ++k) dot += xa[k] * xb[k];
    out[e] = dot;
  }
}

__global__ void DotBackwardKernel(int64_t rows, int64_t vectors, int64_t width, const float* x,
                                  const float* dout, float* dx) {
  const int64_t pairs = vectors * (vectors - 1) / 2;
  const int64_t total = rows * vectors * width;
  for (int64_t e = GlobalThread(); e < total; e += GridThreads()) {
    const int64_t r = e / (vectors * width);
    const int64_t rest = e - r * vectors * width;
    const int64_t a = rest / width;
    const int64_t k = rest - a * width;
    const float* xr = x + r * vectors * width;
    const float* g = dout + r * pairs;
    float acc = 0.0f;
    for (int64_t b = 0; b < vectors; ++b) {
      if (b != a) acc += g[PairIndex(a, b)] * xr[b * width + k];
    }
    dx[e] = acc;
  }
}

}  // namespace
}  // namespace cuda

absl::Status CudaBackend::DoFmForward(int64_t rows, int64_t vectors, int64_t width,
                                      const float* x, float* out) {
  KERNELS_CUDA_ACTIVATE();
  cuda::FmForwardKernel<<<cuda::GridFor(rows * 32, sm_count_), cuda::kThreads, 0, stream_>>>(
      rows, vectors, width, x, out);
  CUDA_RETURN_IF_LAUNCH_FAILED("FmForwardKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoFmBackward(int64_t rows, int64_t vectors, int64_t width,
                                       const float* x, const float* dout, float* dx) {
  KERNELS_CUDA_ACTIVATE();
  cuda::FmBackwardKernel<<<cuda::GridFor(rows * 32, sm_count_), cuda::kThreads, 0, stream_>>>(
      rows, vectors, width, x, dout, dx);
  CUDA_RETURN_IF_LAUNCH_FAILED("FmBackwardKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoDotInteractionForward(int64_t rows, int64_t vectors, int64_t width,
                                                  const float* x, float* out) {
  KERNELS_CUDA_ACTIVATE();
  const int64_t total = rows * (vectors * (vectors - 1) / 2);
  cuda::DotForwardKernel<<<cuda::GridFor(total, sm_count_), cuda::kThreads, 0, stream_>>>(
      rows, vectors, width, x, out);
  CUDA_RETURN_IF_LAUNCH_FAILED("DotForwardKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoDotInteractionBackward(int64_t rows, int64_t vectors, int64_t width,
                                                   const float* x, const float* dout,
                                                   float* dx) {
  KERNELS_CUDA_ACTIVATE();
  const int64_t total = rows * vectors * width;
  cuda::DotBackwardKernel<<<cuda::GridFor(total, sm_count_), cuda::kThreads, 0, stream_>>>(
      rows, vectors, width, x, dout, dx);
  CUDA_RETURN_IF_LAUNCH_FAILED("DotBackwardKernel");
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
