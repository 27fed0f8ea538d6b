#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <library_types.h>

#include "kernels/cuda/cuda_probe.h"

namespace pscluster::cuda {

ProbeResult Probe() {
  ProbeResult r;
  cudaRuntimeGetVersion(&r.runtime_version);
  cudaDriverGetVersion(&r.driver_version);
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS) {
    r.cublas_version = major * 10000 + minor * 100 + patch;
  }
  cudaError_t err = cudaGetDeviceCount(&r.device_count);
  if (err != cudaSuccess) {
    r.device_count = 0;
    r.error = cudaGetErrorString(err);
    cudaGetLastError();  // Clear the sticky error.
    return r;
  }
  if (r.device_count == 0) {
    r.error = "no CUDA device";
    return r;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) r.device_name = prop.name;
  return r;
}

}  // namespace pscluster::cuda
