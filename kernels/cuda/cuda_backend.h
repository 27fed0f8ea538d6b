// The CUDA backend: cuBLAS for GEMM, hand-written kernels (cuda_*.cu) for every other op, one
// stream per backend, every CUDA runtime and cuBLAS call checked. Plain C++ header: the class is
// defined in cuda_backend_impl.h, which only .cu files include.
#ifndef PSCLUSTER_KERNELS_CUDA_CUDA_BACKEND_H_
#define PSCLUSTER_KERNELS_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace pscluster::kernels {

// Creates a backend on device options.cuda_device. REQUIRES: the device exists (see
// create_backend.h, which checks); failures of the runtime or cuBLAS come back as statuses.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options);

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_CUDA_CUDA_BACKEND_H_
