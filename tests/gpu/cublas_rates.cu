#include "tests/gpu/cublas_rates.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pscluster::gpu_bench {
namespace {

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}
absl::Status Cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusString(s)));
}

#define RETURN_IF_ERROR(expr)               \
  do {                                      \
    absl::Status s_ = (expr);               \
    if (!s_.ok()) return s_;                \
  } while (0)

__device__ inline float HashUniform(uint64_t i) {
  i = (i ^ (i >> 33)) * 0xff51afd7ed558ccdull;
  i = (i ^ (i >> 33)) * 0xc4ceb9fe1a85ec53ull;
  i ^= i >> 33;
  return static_cast<float>(i >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

__global__ void FillRandom(int64_t n, uint64_t seed, float* f32, __nv_bfloat16* bf16) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = HashUniform(seed * 0x9e3779b97f4a7c15ull + i);
    if (f32 != nullptr) f32[i] = v;
    if (bf16 != nullptr) bf16[i] = __float2bfloat16(v);
  }
}

// Frees what it holds when the measurement returns, whichever way.
struct DeviceMemory {
  std::vector<void*> ptrs;
  ~DeviceMemory() {
    for (void* p : ptrs) cudaFree(p);
  }
  absl::Status Alloc(size_t bytes, void** out) {
    RETURN_IF_ERROR(Cuda(cudaMalloc(out, bytes), "cudaMalloc"));
    ptrs.push_back(*out);
    return absl::OkStatus();
  }
};

// Two CUDA events, destroyed however the measurement returns.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  ~EventPair() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
  absl::Status Create() {
    RETURN_IF_ERROR(Cuda(cudaEventCreate(&start), "cudaEventCreate"));
    return Cuda(cudaEventCreate(&stop), "cudaEventCreate");
  }
};

}  // namespace

absl::StatusOr<double> CublasGemmTflops(GemmType type, int n, int iters, int device) {
  if (n < 1 || iters < 1) return absl::InvalidArgumentError("n and iters must be >= 1");
  RETURN_IF_ERROR(Cuda(cudaSetDevice(device), "cudaSetDevice"));
  const int64_t elems = int64_t{n} * n;
  const bool bf16 = type == GemmType::kBf16;
  const size_t elem = bf16 ? 2 : 4;
  DeviceMemory mem;
  void *a, *b, *c;
  RETURN_IF_ERROR(mem.Alloc(elems * elem, &a));
  RETURN_IF_ERROR(mem.Alloc(elems * elem, &b));
  RETURN_IF_ERROR(mem.Alloc(elems * elem, &c));
  FillRandom<<<1024, 256>>>(elems, 1, bf16 ? nullptr : static_cast<float*>(a),
                            bf16 ? static_cast<__nv_bfloat16*>(a) : nullptr);
  FillRandom<<<1024, 256>>>(elems, 2, bf16 ? nullptr : static_cast<float*>(b),
                            bf16 ? static_cast<__nv_bfloat16*>(b) : nullptr);
  RETURN_IF_ERROR(Cuda(cudaGetLastError(), "FillRandom"));
  cublasHandle_t handle;
  RETURN_IF_ERROR(Cublas(cublasCreate(&handle), "cublasCreate"));
  struct HandleGuard {
    cublasHandle_t h;
    ~HandleGuard() { cublasDestroy(h); }
  } guard{handle};
  RETURN_IF_ERROR(Cublas(cublasSetMathMode(handle, type == GemmType::kTf32
                                                       ? CUBLAS_TF32_TENSOR_OP_MATH
                                                       : CUBLAS_DEFAULT_MATH),
                         "cublasSetMathMode"));
  const float alpha = 1.0f, beta = 0.0f;
  auto run = [&]() -> absl::Status {
    if (bf16) {
      return Cublas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a,
                                 CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmEx");
    }
    return Cublas(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha,
                              static_cast<float*>(a), n, static_cast<float*>(b), n, &beta,
                              static_cast<float*>(c), n),
                  "cublasSgemm");
  };
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(run());
  EventPair ev;
  RETURN_IF_ERROR(ev.Create());
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    RETURN_IF_ERROR(Cuda(cudaEventRecord(ev.start), "cudaEventRecord"));
    RETURN_IF_ERROR(run());
    RETURN_IF_ERROR(Cuda(cudaEventRecord(ev.stop), "cudaEventRecord"));
    RETURN_IF_ERROR(Cuda(cudaEventSynchronize(ev.stop), "cudaEventSynchronize"));
    float t = 0;
    RETURN_IF_ERROR(Cuda(cudaEventElapsedTime(&t, ev.start, ev.stop), "cudaEventElapsedTime"));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double median_s = ms[ms.size() / 2] / 1e3;
  return 2.0 * n * static_cast<double>(n) * n / median_s / 1e12;
}

}  // namespace pscluster::gpu_bench
