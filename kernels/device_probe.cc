#include "kernels/device_probe.h"

#ifdef PSCLUSTER_HAVE_CUDA
#include "kernels/cuda/cuda_probe.h"
#endif

namespace pscluster {

CudaAvailability ProbeCuda() {
  CudaAvailability out;
#ifdef PSCLUSTER_HAVE_CUDA
  cuda::ProbeResult r = cuda::Probe();
  out.compiled = true;
  out.runtime_version = r.runtime_version;
  out.cublas_version = r.cublas_version;
  out.device_count = r.device_count;
  out.device_name = r.device_name;
  if (r.device_count == 0) out.reason = "CUDA backend compiled, but no usable device: " + r.error;
#else
  out.reason = "built without a CUDA toolkit (CPU backend only)";
#endif
  return out;
}

}  // namespace pscluster
