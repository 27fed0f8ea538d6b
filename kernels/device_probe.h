// What compute devices this process can use: decides --device=auto.
#ifndef PSCLUSTER_KERNELS_DEVICE_PROBE_H_
#define PSCLUSTER_KERNELS_DEVICE_PROBE_H_

#include <string>

namespace pscluster {

struct CudaAvailability {
  bool compiled = false;     // The build found a CUDA toolkit and linked the CUDA backend.
  int runtime_version = 0;   // CUDA runtime version linked (e.g. 13000), 0 when not compiled.
  int cublas_version = 0;    // cuBLAS version linked (e.g. 130100), 0 when not compiled.
  int device_count = 0;      // Usable devices now.
  std::string device_name;   // Device 0's name.
  std::string reason;        // Why CUDA cannot be used (empty when it can).

  bool usable() const { return compiled && device_count > 0; }
};

CudaAvailability ProbeCuda();

}  // namespace pscluster

#endif  // PSCLUSTER_KERNELS_DEVICE_PROBE_H_
