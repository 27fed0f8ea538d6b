#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu/cpu_backend_impl.h"

namespace pscluster::kernels {
namespace {

constexpr size_t kAlignment = 256;
// GEMMs below this many multiply-adds run on one thread: slicing them costs more than it saves.
constexpr int64_t kParallelGemmMacs = int64_t{1} << 20;

std::string OpenBlasVersion() {
  const char* config = openblas_get_config();
  if (config == nullptr) return "OpenBLAS";
  absl::string_view c(config);
  // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64": keep name, version, core.
  std::string out;
  int word = 0;
  for (absl::string_view part : absl::StrSplit(c, ' ', absl::SkipEmpty())) {
    if (word < 2 || (part.find('=') == absl::string_view::npos && part != "DYNAMIC_ARCH" &&
                     part != "NO_AFFINITY" && part != "USE_OPENMP")) {
      absl::StrAppend(&out, out.empty() ? "" : " ", part);
    }
    ++word;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options) {
  if (options.cpu_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu_threads = ", options.cpu_threads, " must be >= 0 (0 = all cores)"));
  }
  int threads = options.cpu_threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  return std::unique_ptr<Backend>(new CpuBackend(threads));
}

CpuBackend::CpuBackend(int threads) : pool_(threads) {
  openblas_set_num_threads(1);
  name_ = absl::StrCat("cpu (", OpenBlasVersion(), ", ", threads, " thread",
                       threads == 1 ? "" : "s", ")");
}

absl::StatusOr<void*> CpuBackend::DoAllocate(size_t bytes, bool /*on_host*/) {
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cpu: cannot allocate ", bytes, " bytes"));
  }
  return p;
}

void CpuBackend::DoFree(void* ptr, bool /*on_host*/) { std::free(ptr); }

absl::Status CpuBackend::DoCopy(const void* src, void* dst, size_t bytes, int /*direction*/) {
  if (src != dst) std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoFill(int64_t n, float value, float* x) {
  pool_.ParallelFor(n, 1 << 16, [&](int64_t b, int64_t e) { std::fill(x + b, x + e, value); });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoGemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                                const float* a, const float* b, float beta, float* c) {
  if (k == 0) {  // C = beta * C; with beta == 0 old values (NaN included) are dropped.
    pool_.ParallelFor(m * n, 1 << 16, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    });
    return absl::OkStatus();
  }
  const CBLAS_TRANSPOSE cta = ta == Trans::kYes ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE ctb = tb == Trans::kYes ? CblasTrans : CblasNoTrans;
  const int lda = ta == Trans::kYes ? static_cast<int>(m) : static_cast<int>(k);
  const int ldb = tb == Trans::kYes ? static_cast<int>(k) : static_cast<int>(n);
  const int ldc = static_cast<int>(n);
  const int threads = pool_.num_threads();
  if (threads == 1 || m * n * k < kParallelGemmMacs) {
    cblas_sgemm(CblasRowMajor, cta, ctb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, lda, b, ldb, beta, c, ldc);
    return absl::OkStatus();
  }
  // One slice per thread along the longer of C's dimensions, in multiples of 16 so that
  // OpenBLAS's micro-kernels see whole panels.
  const bool split_rows = m >= n;
  const int64_t extent = split_rows ? m : n;
  const int64_t slice = std::max<int64_t>(16, (extent / threads + 15) / 16 * 16);
  const int64_t slices = (extent + slice - 1) / slice;
  pool_.ParallelFor(slices, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t lo = s * slice;
      const int64_t len = std::min(extent, lo + slice) - lo;
      if (split_rows) {
        const float* as = ta == Trans::kYes ? a + lo : a + lo * k;
        cblas_sgemm(CblasRowMajor, cta, ctb, static_cast<int>(len), static_cast<int>(n),
                    static_cast<int>(k), alpha, as, lda, b, ldb, beta, c + lo * n, ldc);
      } else {
        const float* bs = tb == Trans::kYes ? b + lo * k : b + lo;
        cblas_sgemm(CblasRowMajor, cta, ctb, static_cast<int>(m), static_cast<int>(len),
                    static_cast<int>(k), alpha, a, lda, bs, ldb, beta, c + lo, ldc);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
