// CpuBackend: im2col / col2im for NHWC convolutions, and max-pooling.
#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend_impl.h"

namespace pscluster::kernels {
namespace {

constexpr int64_t kElementGrain = 1 << 14;

// In NHWC the kernel_w * channels values a kernel row reads are contiguous in x and in the
// patch, so im2col and col2im move whole kernel rows, clipped at the image border.
struct RowSpan {
  int64_t lo, hi;  // Valid kx range [lo, hi) for a kernel row starting at input column ix0.
};
inline RowSpan ValidColumns(int64_t ix0, int64_t kernel_w, int64_t width) {
  return {std::max<int64_t>(0, -ix0), std::min<int64_t>(kernel_w, width - ix0)};
}

}  // namespace

absl::Status CpuBackend::DoIm2Col(const ConvGeometry& g, const float* x, float* cols) {
  const int64_t oh = g.out_h(), ow = g.out_w(), c = g.channels, patch = g.patch_size();
  const int64_t row_len = g.kernel_w * c;
  const int64_t grain = std::max<int64_t>(1, kElementGrain / patch);
  pool_.ParallelFor(g.num_patches(), grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / (oh * ow);
      const int64_t oy = (r / ow) % oh;
      const int64_t ox = r % ow;
      const int64_t ix0 = ox * g.stride - g.pad_w;
      const RowSpan span = ValidColumns(ix0, g.kernel_w, g.width);
      for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
        float* dst = cols + r * patch + ky * row_len;
        const int64_t iy = oy * g.stride - g.pad_h + ky;
        if (iy < 0 || iy >= g.height || span.hi <= span.lo) {
          for (int64_t i = 0; i < row_len; ++i) dst[i] = 0.0f;
          continue;
        }
        const float* src = x + ((b * g.height + iy) * g.width + ix0 + span.lo) * c;
        for (int64_t i = 0; i < span.lo * c; ++i) dst[i] = 0.0f;
        float* mid = dst + span.lo * c;
        for (int64_t i = 0; i < (span.hi - span.lo) * c; ++i) mid[i] = src[i];
        for (int64_t i = span.hi * c; i < row_len; ++i) dst[i] = 0.0f;
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoCol2Im(const ConvGeometry& g, const float* cols, float* dx) {
  // Each thread owns whole images and adds their patches' kernel rows back in patch order, so
  // no element is written by two threads and the summation order is fixed.
  const int64_t oh = g.out_h(), ow = g.out_w(), c = g.channels, patch = g.patch_size();
  const int64_t row_len = g.kernel_w * c;
  const int64_t image = g.height * g.width * c;
  pool_.ParallelFor(g.batch, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* img = dx + b * image;
      std::fill(img, img + image, 0.0f);
      for (int64_t oy = 0; oy < oh; ++oy) {
        for (int64_t ox = 0; ox < ow; ++ox) {
          const float* src_patch = cols + ((b * oh + oy) * ow + ox) * patch;
          const int64_t ix0 = ox * g.stride - g.pad_w;
          const RowSpan span = ValidColumns(ix0, g.kernel_w, g.width);
          if (span.hi <= span.lo) continue;
          for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
            const int64_t iy = oy * g.stride - g.pad_h + ky;
            if (iy < 0 || iy >= g.height) continue;
            const float* src = src_patch + ky * row_len + span.lo * c;
            float* dst = img + (iy * g.width + ix0 + span.lo) * c;
            for (int64_t i = 0; i < (span.hi - span.lo) * c; ++i) dst[i] += src[i];
          }
        }
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoMaxPoolForward(const PoolGeometry& g, const float* x, float* y,
                                          int32_t* argmax) {
  const int64_t oh = g.out_h(), ow = g.out_w(), c = g.channels;
  const int64_t grain = std::max<int64_t>(1, kElementGrain / (c * g.window * g.window));
  pool_.ParallelFor(g.batch * oh * ow, grain, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t b = q / (oh * ow);
      const int64_t oy = (q / ow) % oh;
      const int64_t ox = q % ow;
      float* yo = y + q * c;
      int32_t* ao = argmax + q * c;
      for (int64_t wy = 0; wy < g.window; ++wy) {
        for (int64_t wx = 0; wx < g.window; ++wx) {
          const int64_t base = ((b * g.height + oy * g.stride + wy) * g.width + ox * g.stride + wx) * c;
          const float* xi = x + base;
          if (wy == 0 && wx == 0) {
            for (int64_t ch = 0; ch < c; ++ch) {
              yo[ch] = xi[ch];
              ao[ch] = static_cast<int32_t>(base + ch);
            }
            continue;
          }
          for (int64_t ch = 0; ch < c; ++ch) {
            const float v = xi[ch];
            // NaN wins (v != v), so a NaN input is never hidden by the max.
            if (v > yo[ch] || (v != v && yo[ch] == yo[ch])) {
              yo[ch] = v;
              ao[ch] = static_cast<int32_t>(base + ch);
            }
          }
        }
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoMaxPoolBackward(const PoolGeometry& g, const float* dy,
                                           const int32_t* argmax, float* dx) {
  // Each thread owns whole images: zero them, then add every output's gradient to its argmax.
  const int64_t image = g.height * g.width * g.channels;
  const int64_t outputs = g.out_h() * g.out_w() * g.channels;
  std::atomic<int64_t> bad{-1};
  pool_.ParallelFor(g.batch, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* img = dx + b * image;
      std::fill(img, img + image, 0.0f);
      const int64_t base = b * image;
      for (int64_t q = b * outputs; q < (b + 1) * outputs; ++q) {
        const int64_t i = static_cast<int64_t>(argmax[q]) - base;
        if (i < 0 || i >= image) {
          bad.store(q, std::memory_order_relaxed);
          continue;
        }
        img[i] += dy[q];
      }
    }
  });
  if (bad.load() >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("MaxPoolBackward: argmax[", bad.load(),
                                                   "] is not in its window's image"));
  }
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
