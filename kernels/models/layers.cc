#include "kernels/models/layers.h"

#include <algorithm>

#include "kernels/status_macros.h"

namespace pscluster::kernels {
namespace {

class DenseLayer final : public Layer {
 public:
  DenseLayer(int64_t in, int64_t out, int weight, int bias)
      : in_(in), out_(out), weight_(weight), bias_(bias) {}
  std::vector<int> Params() const override { return {weight_, bias_}; }
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }

  absl::Status Forward(const LayerContext& ctx, const float* in, float* out, void*) override {
    KERNELS_RETURN_IF_ERROR(ctx.backend->Gemm(Trans::kNo, Trans::kNo, ctx.n, out_, in_, 1.0f, in,
                                              ctx.params[weight_], 0.0f, out));
    return ctx.backend->AddBias(ctx.n, out_, out, ctx.params[bias_], out);
  }

  absl::Status Backward(const LayerContext& ctx, const float* in, const float*, const float* dout,
                        float* din, void*) override {
    if (!ctx.grads.empty()) {
      // dW = x^T dy, db = column sums of dy.
      KERNELS_RETURN_IF_ERROR(ctx.backend->Gemm(Trans::kYes, Trans::kNo, in_, out_, ctx.n, 1.0f,
                                                in, dout, 0.0f, ctx.grads[weight_]));
      KERNELS_RETURN_IF_ERROR(ctx.backend->ColumnSum(ctx.n, out_, dout, false, ctx.grads[bias_]));
    }
    if (din == nullptr) return absl::OkStatus();
    return ctx.backend->Gemm(Trans::kNo, Trans::kYes, ctx.n, in_, out_, 1.0f, dout,
                             ctx.params[weight_], 0.0f, din);
  }

 private:
  const int64_t in_, out_;
  const int weight_, bias_;
};

class ActivationLayer final : public Layer {
 public:
  ActivationLayer(int64_t features, Activation f) : features_(features), f_(f) {}
  int64_t in_features() const override { return features_; }
  int64_t out_features() const override { return features_; }

  absl::Status Forward(const LayerContext& ctx, const float* in, float* out, void*) override {
    return ctx.backend->ActivationForward(f_, ctx.n * features_, in, out);
  }
  absl::Status Backward(const LayerContext& ctx, const float* in, const float*, const float* dout,
                        float* din, void*) override {
    if (din == nullptr) return absl::OkStatus();
    return ctx.backend->ActivationBackward(f_, ctx.n * features_, in, dout, din);
  }

 private:
  const int64_t features_;
  const Activation f_;
};

class ConvLayer final : public Layer {
 public:
  ConvLayer(int64_t height, int64_t width, int64_t in_channels, int64_t out_channels,
            int64_t kernel, int64_t pad, int weight, int bias, size_t chunk_bytes)
      : out_channels_(out_channels), weight_(weight), bias_(bias) {
    geometry_.height = height;
    geometry_.width = width;
    geometry_.channels = in_channels;
    geometry_.kernel_h = geometry_.kernel_w = kernel;
    geometry_.pad_h = geometry_.pad_w = pad;
    geometry_.stride = 1;
    pixels_ = geometry_.out_h() * geometry_.out_w();
    const size_t per_image = sizeof(float) * pixels_ * geometry_.patch_size();
    chunk_images_ = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / per_image));
  }
  std::vector<int> Params() const override { return {weight_, bias_}; }
  int64_t in_features() const override {
    return geometry_.height * geometry_.width * geometry_.channels;
  }
  int64_t out_features() const override { return pixels_ * out_channels_; }
  size_t ScratchBytes(int64_t n) const override {
    return sizeof(float) * std::min(n, chunk_images_) * pixels_ * geometry_.patch_size();
  }

  absl::Status Forward(const LayerContext& ctx, const float* in, float* out,
                       void* scratch) override {
    float* cols = static_cast<float*>(scratch);
    for (int64_t b0 = 0; b0 < ctx.n; b0 += chunk_images_) {
      ConvGeometry g = Chunk(ctx.n, b0);
      KERNELS_RETURN_IF_ERROR(ctx.backend->Im2Col(g, in + b0 * in_features(), cols));
      // [patches, patch] x weight^T [patch, out_channels] = NHWC output rows of this chunk.
      KERNELS_RETURN_IF_ERROR(ctx.backend->Gemm(Trans::kNo, Trans::kYes, g.num_patches(),
                                                out_channels_, g.patch_size(), 1.0f, cols,
                                                ctx.params[weight_], 0.0f,
                                                out + b0 * out_features()));
    }
    return ctx.backend->AddBias(ctx.n * pixels_, out_channels_, out, ctx.params[bias_], out);
  }

  absl::Status Backward(const LayerContext& ctx, const float* in, const float*, const float* dout,
                        float* din, void* scratch) override {
    const bool want_grads = !ctx.grads.empty();
    if (!want_grads && din == nullptr) return absl::OkStatus();
    if (want_grads) {
      KERNELS_RETURN_IF_ERROR(ctx.backend->ColumnSum(ctx.n * pixels_, out_channels_, dout, false,
                                                     ctx.grads[bias_]));
    }
    float* cols = static_cast<float*>(scratch);
    // With one chunk, the scratch still holds the forward pass's im2col matrix.
    const bool cols_ready = ctx.n <= chunk_images_;
    for (int64_t b0 = 0; b0 < ctx.n; b0 += chunk_images_) {
      ConvGeometry g = Chunk(ctx.n, b0);
      const float* dy = dout + b0 * out_features();
      if (want_grads) {
        if (!cols_ready) {
          KERNELS_RETURN_IF_ERROR(ctx.backend->Im2Col(g, in + b0 * in_features(), cols));
        }
        // dW [out_channels, patch] += dy^T cols.
        KERNELS_RETURN_IF_ERROR(ctx.backend->Gemm(Trans::kYes, Trans::kNo, out_channels_,
                                                  g.patch_size(), g.num_patches(), 1.0f, dy, cols,
                                                  b0 == 0 ? 0.0f : 1.0f, ctx.grads[weight_]));
      }
      if (din != nullptr) {
        // d(cols) = dy W, then scattered back onto the input (col2im).
        KERNELS_RETURN_IF_ERROR(ctx.backend->Gemm(Trans::kNo, Trans::kNo, g.num_patches(),
                                                  g.patch_size(), out_channels_, 1.0f, dy,
                                                  ctx.params[weight_], 0.0f, cols));
        KERNELS_RETURN_IF_ERROR(ctx.backend->Col2Im(g, cols, din + b0 * in_features()));
      }
    }
    return absl::OkStatus();
  }

 private:
  ConvGeometry Chunk(int64_t n, int64_t b0) const {
    ConvGeometry g = geometry_;
    g.batch = std::min(chunk_images_, n - b0);
    return g;
  }

  ConvGeometry geometry_;
  int64_t pixels_ = 0;
  int64_t chunk_images_ = 1;
  const int64_t out_channels_;
  const int weight_, bias_;
};

class MaxPoolLayer final : public Layer {
 public:
  MaxPoolLayer(int64_t height, int64_t width, int64_t channels, int64_t window) {
    geometry_.height = height;
    geometry_.width = width;
    geometry_.channels = channels;
    geometry_.window = geometry_.stride = window;
  }
  int64_t in_features() const override {
    return geometry_.height * geometry_.width * geometry_.channels;
  }
  int64_t out_features() const override {
    return geometry_.out_h() * geometry_.out_w() * geometry_.channels;
  }
  size_t ScratchBytes(int64_t n) const override { return sizeof(int32_t) * n * out_features(); }

  absl::Status Forward(const LayerContext& ctx, const float* in, float* out,
                       void* scratch) override {
    PoolGeometry g = geometry_;
    g.batch = ctx.n;
    return ctx.backend->MaxPoolForward(g, in, out, static_cast<int32_t*>(scratch));
  }
  absl::Status Backward(const LayerContext& ctx, const float*, const float*, const float* dout,
                        float* din, void* scratch) override {
    if (din == nullptr) return absl::OkStatus();
    PoolGeometry g = geometry_;
    g.batch = ctx.n;
    return ctx.backend->MaxPoolBackward(g, dout, static_cast<const int32_t*>(scratch), din);
  }

 private:
  PoolGeometry geometry_;
};

}  // namespace

std::unique_ptr<Layer> MakeDenseLayer(int64_t in, int64_t out, int weight, int bias) {
  return std::make_unique<DenseLayer>(in, out, weight, bias);
}

std::unique_ptr<Layer> MakeActivationLayer(int64_t features, Activation f) {
  return std::make_unique<ActivationLayer>(features, f);
}

std::unique_ptr<Layer> MakeConvLayer(int64_t height, int64_t width, int64_t in_channels,
                                     int64_t out_channels, int64_t kernel, int64_t pad,
                                     int weight, int bias, size_t chunk_bytes) {
  return std::make_unique<ConvLayer>(height, width, in_channels, out_channels, kernel, pad,
                                     weight, bias, chunk_bytes);
}

std::unique_ptr<Layer> MakeMaxPoolLayer(int64_t height, int64_t width, int64_t channels,
                                        int64_t window) {
  return std::make_unique<MaxPoolLayer>(height, width, channels, window);
}

}  // namespace pscluster::kernels
