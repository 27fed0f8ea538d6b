// CpuBackend: im2col / col2im for NHWC convolutions, and max-pooling.
#include <algorithm>

#include "kernels/cpu/cpu_backend_impl.h"

namespace pscluster::kernels {
namespace {

constexpr int64_t kElementGrain = 1 << 14;

// First and last (inclusive) output positions whose window [o*stride - pad, ... + kernel) covers
// input position i; last < first when none does.
inline void CoveringOutputs(int64_t i, int64_t pad, int64_t kernel, int64_t stride, int64_t outs,
                            int64_t* first, int64_t* last) {
  // o*stride - pad <= i  and  o*stride - pad + kernel - 1 >= i.
  const int64_t hi = i + pad;              // o*stride <= hi
  const int64_t lo = i + pad - kernel + 1;  // o*stride >= lo
  *first = lo <= 0 ? 0 : (lo + stride - 1) / stride;
  *last = std::min(outs - 1, hi / stride);
}

}  // namespace

absl::Status CpuBackend::DoIm2Col(const ConvGeometry& g, const float* x, float* cols) {
  const int64_t oh = g.out_h(), ow = g.out_w(), c = g.channels, patch = g.patch_size();
  const int64_t grain = std::max<int64_t>(1, kElementGrain / patch);
  pool_.ParallelFor(g.num_patches(), grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / (oh * ow);
      const int64_t oy = (r / ow) % oh;
      const int64_t ox = r % ow;
      float* out = cols + r * patch;
      for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
        const int64_t iy = oy * g.stride - g.pad_h + ky;
        for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
          const int64_t ix = ox * g.stride - g.pad_w + kx;
          float* dst = out + (ky * g.kernel_w + kx) * c;
          if (iy < 0 || iy >= g.height || ix < 0 || ix >= g.width) {
            std::fill(dst, dst + c, 0.0f);
          } else {
            std::copy_n(x + ((b * g.height + iy) * g.width + ix) * c, c, dst);
          }
        }
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoCol2Im(const ConvGeometry& g, const float* cols, float* dx) {
  // Gather form: each input pixel sums the patch entries that read it, so no two threads ever
  // write the same element and the summation order is fixed.
  const int64_t oh = g.out_h(), ow = g.out_w(), c = g.channels, patch = g.patch_size();
  const int64_t pixels = g.batch * g.height * g.width;
  const int64_t grain = std::max<int64_t>(1, kElementGrain / (c * g.kernel_h * g.kernel_w));
  pool_.ParallelFor(pixels, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = p / (g.height * g.width);
      const int64_t iy = (p / g.width) % g.height;
      const int64_t ix = p % g.width;
      float* out = dx + p * c;
      std::fill(out, out + c, 0.0f);
      int64_t oy0, oy1, ox0, ox1;
      CoveringOutputs(iy, g.pad_h, g.kernel_h, g.stride, oh, &oy0, &oy1);
      CoveringOutputs(ix, g.pad_w, g.kernel_w, g.stride, ow, &ox0, &ox1);
      for (int64_t oy = oy0; oy <= oy1; ++oy) {
        const int64_t ky = iy + g.pad_h - oy * g.stride;
        for (int64_t ox = ox0; ox <= ox1; ++ox) {
          const int64_t kx = ix + g.pad_w - ox * g.stride;
          const float* src = cols + ((b * oh + oy) * ow + ox) * patch + (ky * g.kernel_w + kx) * c;
          for (int64_t ch = 0; ch < c; ++ch) out[ch] += src[ch];
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
  const int64_t oh = g.out_h(), ow = g.out_w(), c = g.channels;
  const int64_t pixels = g.batch * g.height * g.width;
  const int64_t grain = std::max<int64_t>(1, kElementGrain / c);
  pool_.ParallelFor(pixels, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = p / (g.height * g.width);
      const int64_t iy = (p / g.width) % g.height;
      const int64_t ix = p % g.width;
      float* out = dx + p * c;
      std::fill(out, out + c, 0.0f);
      int64_t oy0, oy1, ox0, ox1;
      CoveringOutputs(iy, 0, g.window, g.stride, oh, &oy0, &oy1);
      CoveringOutputs(ix, 0, g.window, g.stride, ow, &ox0, &ox1);
      for (int64_t oy = oy0; oy <= oy1; ++oy) {
        for (int64_t ox = ox0; ox <= ox1; ++ox) {
          const int64_t q = ((b * oh + oy) * ow + ox) * c;
          for (int64_t ch = 0; ch < c; ++ch) {
            if (argmax[q + ch] == p * c + ch) out[ch] += dy[q + ch];
          }
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
