// Plain C++ view of the CUDA runtime and cuBLAS for code compiled without nvcc. Implemented in
// cuda_probe.cu, which exists in the build only when a CUDA toolkit was found.
#ifndef PSCLUSTER_KERNELS_CUDA_CUDA_PROBE_H_
#define PSCLUSTER_KERNELS_CUDA_CUDA_PROBE_H_

#include <string>

namespace pscluster::cuda {

struct ProbeResult {
  int runtime_version = 0;   // cudaRuntimeGetVersion, e.g. 13000.
  int driver_version = 0;    // cudaDriverGetVersion: the newest CUDA the driver runs; 0 without one.
  int cublas_version = 0;    // cublasGetProperty major*10000 + minor*100 + patch.
  int device_count = 0;      // 0 when there is no driver or no device.
  std::string device_name;   // Name of device 0.
  std::string error;         // Why there is no usable device (empty when device_count > 0).
};

ProbeResult Probe();

}  // namespace pscluster::cuda

#endif  // PSCLUSTER_KERNELS_CUDA_CUDA_PROBE_H_
