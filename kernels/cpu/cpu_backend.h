// The CPU backend: OpenBLAS sgemm for GEMM and multi-threaded loops (the compiler vectorises
// their inner loops) for everything else, all on one ThreadPool. OpenBLAS itself runs
// single-threaded: the backend splits each large GEMM into one slice per pool thread, so OpenBLAS
// threads never spin against the pool's.
//
// Device memory is host memory (shares_host_memory() is true), ops run synchronously, and a bad
// index is reported by the op that saw it, before any output is written.
#ifndef PSCLUSTER_KERNELS_CPU_CPU_BACKEND_H_
#define PSCLUSTER_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace pscluster::kernels {

// Sets OpenBLAS's own thread count to 1 for the whole process (see above).
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options);

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_CPU_CPU_BACKEND_H_
