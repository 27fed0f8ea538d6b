#include "kernels/create_backend.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/device_probe.h"

#ifdef PSCLUSTER_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace pscluster::kernels {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> CreateCuda(const BackendOptions& options) {
  const CudaAvailability cuda = ProbeCuda();
  if (!cuda.usable()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device \"cuda\" was asked for but cannot be used: ", cuda.reason,
                     " (use --device=cpu or --device=auto)"));
  }
#ifdef PSCLUSTER_HAVE_CUDA
  if (options.cuda_device < 0 || options.cuda_device >= cuda.device_count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", options.cuda_device, " does not exist (", cuda.device_count,
                     " device", cuda.device_count == 1 ? "" : "s", " present)"));
  }
  return CreateCudaBackend(options);
#else
  return absl::FailedPreconditionError("built without CUDA");  // Unreachable: usable() is false.
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view device,
                                                       const BackendOptions& options) {
  const std::string d = absl::AsciiStrToLower(device);
  if (d == "cpu") return CreateCpuBackend(options);
  if (d == "auto") {
    if (ProbeCuda().usable()) return CreateCuda(options);
    return CreateCpuBackend(options);
  }
  if (d == "cuda") return CreateCuda(options);
  if (absl::StartsWith(d, "cuda:")) {
    int ordinal = -1;
    if (!absl::SimpleAtoi(absl::string_view(d).substr(5), &ordinal) || ordinal < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("device \"", device, "\": the CUDA ordinal must be a number >= 0"));
    }
    BackendOptions with_ordinal = options;
    with_ordinal.cuda_device = ordinal;
    return CreateCuda(with_ordinal);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", device, "\" is not one of auto, cuda, cuda:N, cpu"));
}

}  // namespace pscluster::kernels
