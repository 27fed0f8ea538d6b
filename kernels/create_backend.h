// Chooses and creates a compute backend from a device string, as given by --device.
#ifndef PSCLUSTER_KERNELS_CREATE_BACKEND_H_
#define PSCLUSTER_KERNELS_CREATE_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"

namespace pscluster::kernels {

// `device` is one of:
//   "auto"             CUDA device options.cuda_device when one is usable, else the CPU backend;
//   "cuda" / "cuda:N"  the CUDA backend on device options.cuda_device / N; FAILED_PRECONDITION,
//                      with the reason, when the build has no CUDA or no usable device exists;
//   "cpu"              the CPU backend.
// Anything else is INVALID_ARGUMENT.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view device,
                                                       const BackendOptions& options);

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_CREATE_BACKEND_H_
