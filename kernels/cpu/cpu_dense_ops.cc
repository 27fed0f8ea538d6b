// CpuBackend: bias, column sums, block copies, activations, and softmax and sigmoid
// cross-entropy.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend_impl.h"

namespace pscluster::kernels {
namespace {

constexpr int64_t kElementGrain = 1 << 14;  // Elementwise work per chunk.
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

}  // namespace

absl::Status CpuBackend::DoAddBias(int64_t rows, int64_t cols, const float* x, const float* bias,
                                   float* y) {
  const int64_t grain = std::max<int64_t>(1, kElementGrain / cols);
  pool_.ParallelFor(rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      for (int64_t j = 0; j < cols; ++j) yr[j] = xr[j] + bias[j];
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoColumnSum(int64_t rows, int64_t cols, const float* x, bool accumulate,
                                     float* out) {
  auto sum_rows = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* acc) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * cols;
      for (int64_t j = c0; j < c1; ++j) acc[j - c0] += xr[j];
    }
  };
  const int threads = pool_.num_threads();
  const bool small = rows * cols < kElementGrain * 2;
  if (small || threads == 1 || cols >= 64 * threads) {
    // Columns split across threads: each owns its outputs, no partial sums needed.
    const int64_t grain =
        small ? cols : std::min<int64_t>(cols, std::max<int64_t>(64, kElementGrain / rows));
    pool_.ParallelFor(cols, grain, [&](int64_t c0, int64_t c1) {
      if (!accumulate) std::fill(out + c0, out + c1, 0.0f);
      sum_rows(0, rows, c0, c1, out + c0);
    });
    return absl::OkStatus();
  }
  // Few columns, many rows: one partial row of sums per fixed row chunk, then a serial combine
  // (the chunking does not depend on scheduling, so results are deterministic).
  const int64_t chunks = std::min<int64_t>(rows, 4 * threads);
  const int64_t per = (rows + chunks - 1) / chunks;
  column_partials_.assign(chunks * cols, 0.0f);
  pool_.ParallelFor(chunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      sum_rows(k * per, std::min(rows, (k + 1) * per), 0, cols, column_partials_.data() + k * cols);
    }
  });
  if (!accumulate) std::fill(out, out + cols, 0.0f);
  for (int64_t k = 0; k < chunks; ++k) {
    const float* p = column_partials_.data() + k * cols;
    for (int64_t j = 0; j < cols; ++j) out[j] += p[j];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::DoActivationForward(Activation f, int64_t n, const float* x, float* y) {
  if (f == Activation::kRelu) {
    pool_.ParallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];  // NaN passes through.
    });
  } else {
    pool_.ParallelFor(n, kElementGrain / 8, [&](int64_t b, int64_t e) {
      // 0.5 x (1 + erf(x / sqrt 2)) == 0.5 x erfc(-x / sqrt 2), without cancellation for x << 0.
      for (int64_t i = b; i < e; ++i) y[i] = 0.5f * x[i] * std::erfc(-x[i] * kInvSqrt2);
    });
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::DoActivationBackward(Activation f, int64_t n, const float* x,
                                              const float* dy, float* dx) {
  if (f == Activation::kRelu) {
    pool_.ParallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    });
  } else {
    pool_.ParallelFor(n, kElementGrain / 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float v = x[i];
        const float cdf = 0.5f * std::erfc(-v * kInvSqrt2);
        const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
        dx[i] = dy[i] * (cdf + v * pdf);
      }
    });
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::DoSoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                               const int32_t* labels, float grad_scale,
                                               float* dlogits, float* row_stats) {
  for (int64_t i = 0; i < rows; ++i) {
    if (labels[i] < 0 || labels[i] >= classes) {
      return absl::InvalidArgumentError(absl::StrCat("SoftmaxCrossEntropy: labels[", i, "] = ",
                                                     labels[i], " is outside [0, ", classes,
                                                     ")"));
    }
  }
  const int64_t grain = std::max<int64_t>(1, kElementGrain / 4 / classes);
  pool_.ParallelFor(rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* z = logits + r * classes;
      const int32_t label = labels[r];
      float max = z[0];
      int64_t argmax = 0;
      for (int64_t j = 1; j < classes; ++j) {
        if (z[j] > max) {
          max = z[j];
          argmax = j;
        }
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < classes; ++j) sum += std::exp(z[j] - max);
      const float log_sum = std::log(sum);
      row_stats[2 * r] = log_sum - (z[label] - max);
      row_stats[2 * r + 1] = argmax == label ? 1.0f : 0.0f;
      if (dlogits != nullptr) {
        const float scale = grad_scale / sum;
        float* d = dlogits + r * classes;
        for (int64_t j = 0; j < classes; ++j) d[j] = scale * std::exp(z[j] - max);
        d[label] -= grad_scale;
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoSigmoidCrossEntropy(int64_t rows, const float* logits,
                                               const int32_t* labels, float grad_scale,
                                               float* dlogits, float* row_stats) {
  for (int64_t i = 0; i < rows; ++i) {
    if (labels[i] != 0 && labels[i] != 1) {
      return absl::InvalidArgumentError(absl::StrCat("SigmoidCrossEntropy: labels[", i, "] = ",
                                                     labels[i], " is not 0 or 1"));
    }
  }
  pool_.ParallelFor(rows, kElementGrain / 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float z = logits[r];  // Read before dlogits (which may alias) is written.
      const float y = static_cast<float>(labels[r]);
      // log(1 + e^z) - y z = max(z, 0) - y z + log1p(e^-|z|), with no overflow either way. A NaN
      // logit gives a NaN loss through y z.
      row_stats[2 * r] = std::fmax(z, 0.0f) - z * y + std::log1p(std::exp(-std::fabs(z)));
      row_stats[2 * r + 1] = (z > 0.0f) == (labels[r] == 1) ? 1.0f : 0.0f;
      if (dlogits != nullptr) {
        float p;
        if (z >= 0.0f) {
          p = 1.0f / (1.0f + std::exp(-z));
        } else {
          const float e = std::exp(z);  // NaN lands here and stays NaN.
          p = e / (1.0f + e);
        }
        dlogits[r] = grad_scale * (p - y);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoCopyBlock(int64_t rows, int64_t cols, const float* src,
                                     int64_t src_stride, float* dst, int64_t dst_stride,
                                     bool accumulate) {
  const int64_t grain = std::max<int64_t>(1, kElementGrain / cols);
  pool_.ParallelFor(rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* s = src + r * src_stride;
      float* d = dst + r * dst_stride;
      if (accumulate) {
        for (int64_t j = 0; j < cols; ++j) d[j] += s[j];
      } else {
        std::copy_n(s, cols, d);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
