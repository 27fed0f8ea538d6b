// cuBLAS GEMM throughput on the current device, for the GPU check's table. Plain C++ header;
// implemented in cublas_rates.cu (present only in builds with a CUDA toolkit).
#ifndef PSCLUSTER_TESTS_GPU_CUBLAS_RATES_H_
#define PSCLUSTER_TESTS_GPU_CUBLAS_RATES_H_

#include "absl/status/statusor.h"

namespace pscluster::gpu_bench {

enum class GemmType {
  kFp32,  // cublasSgemm, default math (no tensor cores).
  kTf32,  // cublasSgemm with CUBLAS_TF32_TENSOR_OP_MATH.
  kBf16,  // cublasGemmEx, bf16 inputs and output, fp32 accumulation.
};

// TFLOP/s of an n x n x n GEMM on random data: the median of `iters` timed calls (CUDA events)
// after warm-up, on device `device`.
absl::StatusOr<double> CublasGemmTflops(GemmType type, int n, int iters, int device);

}  // namespace pscluster::gpu_bench

#endif  // PSCLUSTER_TESTS_GPU_CUBLAS_RATES_H_
