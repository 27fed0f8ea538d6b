// CpuBackend: feature interactions (factorization machine, DLRM dot interaction), one row of
// [vectors, width] at a time.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_backend_impl.h"

namespace pscluster::kernels {
namespace {

constexpr int64_t kElementGrain = 1 << 14;

// Rows per chunk so that each chunk does about kElementGrain multiply-adds.
int64_t RowGrain(int64_t work_per_row) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, work_per_row));
}

}  // namespace

absl::Status CpuBackend::DoFmForward(int64_t rows, int64_t vectors, int64_t width,
                                     const float* x, float* out) {
  const int64_t row_size = vectors * width;
  pool_.ParallelFor(rows, RowGrain(2 * row_size), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * row_size;
      float acc = 0.0f;
      for (int64_t k = 0; k < width; ++k) {
        float s = 0.0f, q = 0.0f;
        for (int64_t a = 0; a < vectors; ++a) {
          const float v = xr[a * width + k];
          s += v;
          q += v * v;
        }
        acc += s * s - q;
      }
      out[r] = 0.5f * acc;
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoFmBackward(int64_t rows, int64_t vectors, int64_t width,
                                      const float* x, const float* dout, float* dx) {
  const int64_t row_size = vectors * width;
  pool_.ParallelFor(rows, RowGrain(2 * row_size), [&](int64_t r0, int64_t r1) {
    std::vector<float> sum(width);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * row_size;
      float* dr = dx + r * row_size;
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t a = 0; a < vectors; ++a) {
        for (int64_t k = 0; k < width; ++k) sum[k] += xr[a * width + k];
      }
      const float g = dout[r];
      for (int64_t a = 0; a < vectors; ++a) {
        for (int64_t k = 0; k < width; ++k) dr[a * width + k] = g * (sum[k] - xr[a * width + k]);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoDotInteractionForward(int64_t rows, int64_t vectors, int64_t width,
                                                 const float* x, float* out) {
  const int64_t row_size = vectors * width;
  const int64_t pairs = vectors * (vectors - 1) / 2;
  pool_.ParallelFor(rows, RowGrain(pairs * width), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * row_size;
      float* o = out + r * pairs;
      for (int64_t a = 1; a < vectors; ++a) {
        const float* xa = xr + a * width;
        for (int64_t b = 0; b < a; ++b) {
          const float* xb = xr + b * width;
          float dot = 0.0f;
          for (int64_t k = 0; k < width; ++k) dot += xa[k] * xb[k];
          *o++ = dot;
        }
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoDotInteractionBackward(int64_t rows, int64_t vectors, int64_t width,
                                                  const float* x, const float* dout, float* dx) {
  const int64_t row_size = vectors * width;
  const int64_t pairs = vectors * (vectors - 1) / 2;
  pool_.ParallelFor(rows, RowGrain(2 * pairs * width), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * row_size;
      const float* g = dout + r * pairs;
      float* dr = dx + r * row_size;
      for (int64_t a = 0; a < vectors; ++a) {
        float* da = dr + a * width;
        std::fill(da, da + width, 0.0f);
        for (int64_t b = 0; b < vectors; ++b) {
          if (b == a) continue;
          const float w = a > b ? g[a * (a - 1) / 2 + b] : g[b * (b - 1) / 2 + a];
          const float* xb = xr + b * width;
          for (int64_t k = 0; k < width; ++k) da[k] += w * xb[k];
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
