// Status helpers for CUDA runtime and cuBLAS calls and kernel launches (.cu files only).
#ifndef PSCLUSTER_KERNELS_CUDA_CUDA_CHECK_H_
#define PSCLUSTER_KERNELS_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pscluster::kernels::cuda {

inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat("CUDA error in ", what, ": ", cudaGetErrorName(err), " (",
                                 cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

inline absl::Status CublasStatus(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string msg =
      absl::StrCat("cuBLAS error in ", what, ": ", cublasGetStatusName(st), " (",
                   cublasGetStatusString(st), ")");
  if (st == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace pscluster::kernels::cuda

// Returns a status from the enclosing function when a CUDA runtime call fails.
#define CUDA_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                              \
    cudaError_t cuda_err_ = (expr);                                                 \
    if (cuda_err_ != cudaSuccess) return ::pscluster::kernels::cuda::CudaStatus(cuda_err_, #expr); \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                 \
    cublasStatus_t cublas_st_ = (expr);                                                \
    if (cublas_st_ != CUBLAS_STATUS_SUCCESS)                                           \
      return ::pscluster::kernels::cuda::CublasStatus(cublas_st_, #expr);              \
  } while (0)

// Checks the launch just made (bad configuration, missing kernel image, earlier sticky errors).
// `kernel_name` must be a string literal.
#define CUDA_RETURN_IF_LAUNCH_FAILED(kernel_name)                                        \
  do {                                                                                   \
    cudaError_t cuda_err_ = cudaGetLastError();                                          \
    if (cuda_err_ != cudaSuccess)                                                        \
      return ::pscluster::kernels::cuda::CudaStatus(cuda_err_, "launch of " kernel_name); \
  } while (0)

#endif  // PSCLUSTER_KERNELS_CUDA_CUDA_CHECK_H_
