// CudaBackend: NHWC im2col / col2im and max-pooling. Backward passes are gathers (each input
// element sums what it fed), so they need no atomics and are deterministic.
#include "kernels/cuda/cuda_backend_impl.h"

namespace pscluster::kernels {
namespace cuda {
namespace {

// Plain copy of the geometry with the index type the kernels compute in.
template <typename I>
struct Conv {
  I batch, height, width, channels, kernel_h, kernel_w, pad_h, pad_w, stride, out_h, out_w;
  explicit Conv(const ConvGeometry& g)
      : batch(g.batch), height(g.height), width(g.width), channels(g.channels),
        kernel_h(g.kernel_h), kernel_w(g.kernel_w), pad_h(g.pad_h), pad_w(g.pad_w),
        stride(g.stride), out_h(g.out_h()), out_w(g.out_w()) {}
};

template <typename I>
struct Pool {
  I batch, height, width, channels, window, stride, out_h, out_w;
  explicit Pool(const PoolGeometry& g)
      : batch(g.batch), height(g.height), width(g.width), channels(g.channels),
        window(g.window), stride(g.stride), out_h(g.out_h()), out_w(g.out_w()) {}
};

template <typename I>
__device__ inline I Thread() { return static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; }
template <typename I>
__device__ inline I Stride() { return static_cast<I>(gridDim.x) * blockDim.x; }

// Output positions whose window covers input position i (see cpu_conv_ops.cc).
template <typename I>
__device__ inline void Covering(I i, I pad, I kernel, I stride, I outs, I* first, I* last) {
  const I hi = i + pad;
  const I lo = i + pad - kernel + 1;
  *first = lo <= 0 ? 0 : (lo + stride - 1) / stride;
  *last = min(outs - 1, hi / stride);
}

template <typename I>
__global__ void Im2ColKernel(Conv<I> g, I total, const float* x, float* cols) {
  const I patch = g.kernel_h * g.kernel_w * g.channels;
  for (I e = Thread<I>(); e < total; e += Stride<I>()) {
    const I r = e / patch;
    const I q = e - r * patch;
    const I c = q % g.channels;
    const I kk = q / g.channels;
    const I kx = kk % g.kernel_w, ky = kk / g.kernel_w;
    const I ox = r % g.out_w;
    const I oy = (r / g.out_w) % g.out_h;
    const I b = r / (g.out_w * g.out_h);
    const I iy = oy * g.stride - g.pad_h + ky;
    const I ix = ox * g.stride - g.pad_w + kx;
    const bool inside = iy >= 0 && iy < g.height && ix >= 0 && ix < g.width;
    cols[e] = inside ? x[((b * g.height + iy) * g.width + ix) * g.channels + c] : 0.0f;
  }
}

template <typename I>
__global__ void Col2ImKernel(Conv<I> g, I total, const float* cols, float* dx) {
  const I patch = g.kernel_h * g.kernel_w * g.channels;
  for (I e = Thread<I>(); e < total; e += Stride<I>()) {
    const I c = e % g.channels;
    const I p = e / g.channels;
    const I ix = p % g.width;
    const I iy = (p / g.width) % g.height;
    const I b = p / (g.width * g.height);
    I oy0, oy1, ox0, ox1;
    Covering<I>(iy, g.pad_h, g.kernel_h, g.stride, g.out_h, &oy0, &oy1);
    Covering<I>(ix, g.pad_w, g.kernel_w, g.stride, g.out_w, &ox0, &ox1);
    float acc = 0.0f;
    for (I oy = oy0; oy <= oy1; ++oy) {
      const I ky = iy + g.pad_h - oy * g.stride;
      for (I ox = ox0; ox <= ox1; ++ox) {
        const I kx = ix + g.pad_w - ox * g.stride;
        acc += cols[((b * g.out_h + oy) * g.out_w + ox) * patch + (ky * g.kernel_w + kx) * g.channels + c];
      }
    }
    dx[e] = acc;
  }
}

template <typename I>
__global__ void MaxPoolForwardKernel(Pool<I> g, I total, const float* x, float* y,
                                     int32_t* argmax) {
  for (I e = Thread<I>(); e < total; e += Stride<I>()) {
    const I c = e % g.channels;
    const I q = e / g.channels;
    const I ox = q % g.out_w;
    const I oy = (q / g.out_w) % g.out_h;
    const I b = q / (g.out_w * g.out_h);
    float best = 0.0f;
    I best_i = -1;
    for (I wy = 0; wy < g.window; ++wy) {
      for (I wx = 0; wx < g.window; ++wx) {
        const I i = ((b * g.height + oy * g.stride + wy) * g.width + ox * g.stride + wx) *
                        g.channels + c;
        const float v = x[i];
        // First maximum in window order; NaN wins (and the first NaN stays).
        if (best_i < 0 || v > best || (v != v && best == best)) {
          best = v;
          best_i = i;
        }
      }
    }
    y[e] = best;
    argmax[e] = static_cast<int32_t>(best_i);
  }
}

template <typename I>
__global__ void MaxPoolBackwardKernel(Pool<I> g, I total, const float* dy, const int32_t* argmax,
                                      float* dx) {
  for (I e = Thread<I>(); e < total; e += Stride<I>()) {
    const I c = e % g.channels;
    const I p = e / g.channels;
    const I ix = p % g.width;
    const I iy = (p / g.width) % g.height;
    const I b = p / (g.width * g.height);
    I oy0, oy1, ox0, ox1;
    Covering<I>(iy, I{0}, g.window, g.stride, g.out_h, &oy0, &oy1);
    Covering<I>(ix, I{0}, g.window, g.stride, g.out_w, &ox0, &ox1);
    float acc = 0.0f;
    for (I oy = oy0; oy <= oy1; ++oy) {
      for (I ox = ox0; ox <= ox1; ++ox) {
        const I q = ((b * g.out_h + oy) * g.out_w + ox) * g.channels + c;
        if (argmax[q] == e) acc += dy[q];
      }
    }
    dx[e] = acc;
  }
}

}  // namespace
}  // namespace cuda

absl::Status CudaBackend::DoIm2Col(const ConvGeometry& g, const float* x, float* cols) {
  KERNELS_CUDA_ACTIVATE();
  const int64_t total = g.num_patches() * g.patch_size();
  const unsigned grid = cuda::GridFor(total, sm_count_);
  if (total < cuda::kInt32IndexLimit && g.input_size() < cuda::kInt32IndexLimit) {
    cuda::Im2ColKernel<int32_t><<<grid, cuda::kThreads, 0, stream_>>>(
        cuda::Conv<int32_t>(g), static_cast<int32_t>(total), x, cols);
  } else {
    cuda::Im2ColKernel<int64_t><<<grid, cuda::kThreads, 0, stream_>>>(cuda::Conv<int64_t>(g),
                                                                      total, x, cols);
  }
  CUDA_RETURN_IF_LAUNCH_FAILED("Im2ColKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoCol2Im(const ConvGeometry& g, const float* cols, float* dx) {
  KERNELS_CUDA_ACTIVATE();
  const int64_t total = g.input_size();
  const unsigned grid = cuda::GridFor(total, sm_count_);
  if (g.num_patches() * g.patch_size() < cuda::kInt32IndexLimit &&
      total < cuda::kInt32IndexLimit) {
    cuda::Col2ImKernel<int32_t><<<grid, cuda::kThreads, 0, stream_>>>(
        cuda::Conv<int32_t>(g), static_cast<int32_t>(total), cols, dx);
  } else {
    cuda::Col2ImKernel<int64_t><<<grid, cuda::kThreads, 0, stream_>>>(cuda::Conv<int64_t>(g),
                                                                      total, cols, dx);
  }
  CUDA_RETURN_IF_LAUNCH_FAILED("Col2ImKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoMaxPoolForward(const PoolGeometry& g, const float* x, float* y,
                                           int32_t* argmax) {
  KERNELS_CUDA_ACTIVATE();
  // input_size() < 2^31 is checked by the interface; the grid-stride margin needs a bit more.
  if (g.input_size() >= cuda::kInt32IndexLimit) {
    return absl::InvalidArgumentError("MaxPoolForward: input too large for the CUDA kernel");
  }
  const int64_t total = g.output_size();
  cuda::MaxPoolForwardKernel<int32_t><<<cuda::GridFor(total, sm_count_), cuda::kThreads, 0,
                                        stream_>>>(cuda::Pool<int32_t>(g),
                                                   static_cast<int32_t>(total), x, y, argmax);
  CUDA_RETURN_IF_LAUNCH_FAILED("MaxPoolForwardKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoMaxPoolBackward(const PoolGeometry& g, const float* dy,
                                            const int32_t* argmax, float* dx) {
  KERNELS_CUDA_ACTIVATE();
  const int64_t total = g.input_size();
  if (total >= cuda::kInt32IndexLimit) {
    return absl::InvalidArgumentError("MaxPoolBackward: input too large for the CUDA kernel");
  }
  cuda::MaxPoolBackwardKernel<int32_t><<<cuda::GridFor(total, sm_count_), cuda::kThreads, 0,
                                         stream_>>>(cuda::Pool<int32_t>(g),
                                                    static_cast<int32_t>(total), dy, argmax, dx);
  CUDA_RETURN_IF_LAUNCH_FAILED("MaxPoolBackwardKernel");
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
