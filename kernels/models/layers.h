// The layers a graph model's mlp and conv2d nodes are stacks of (graph_model.h). Each maps a
// [n, in_features] tensor to [n, out_features] on the backend, reading its parameters and
// writing its gradients through device pointers the model supplies.
#ifndef PSCLUSTER_KERNELS_MODELS_LAYERS_H_
#define PSCLUSTER_KERNELS_MODELS_LAYERS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace pscluster::kernels {

// What a layer sees during one step. Pointers index like Model::params().
struct LayerContext {
  Backend* backend = nullptr;
  int64_t n = 0;                       // Examples in the step.
  std::vector<const float*> params;    // Device pointers to parameter values.
  std::vector<float*> grads;           // Device pointers to gradients (empty when evaluating).
  std::vector<int64_t> sparse_rows;    // Rows supplied per sparse parameter (0 for dense).
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual int64_t in_features() const = 0;   // Per example.
  virtual int64_t out_features() const = 0;  // Per example.
  // Device scratch this layer keeps from forward to backward for n examples.
  virtual size_t ScratchBytes(int64_t n) const { return 0; }
  // The parameters (indices into LayerContext::params) whose gradients Backward writes, all of
  // them complete when it returns.
  virtual std::vector<int> Params() const { return {}; }
  virtual absl::Status Forward(const LayerContext& ctx, const float* in, float* out,
                               void* scratch) = 0;
  // Writes this layer's parameter gradients and, when din is non-null, d(loss)/d(in).
  virtual absl::Status Backward(const LayerContext& ctx, const float* in, const float* out,
                                const float* dout, float* din, void* scratch) = 0;
};

// y = x W + b, W [in, out] (param `weight`), b [out] (param `bias`).
std::unique_ptr<Layer> MakeDenseLayer(int64_t in, int64_t out, int weight, int bias);

// y = f(x) elementwise over `features` per example.
std::unique_ptr<Layer> MakeActivationLayer(int64_t features, Activation f);

// 2-D convolution over NHWC [height, width, in_channels] per example, square kernel, stride 1,
// zero padding `pad`; weight [out_channels, kernel, kernel, in_channels], bias [out_channels].
// Works through the batch `chunk_bytes` of im2col matrix at a time.
std::unique_ptr<Layer> MakeConvLayer(int64_t height, int64_t width, int64_t in_channels,
                                     int64_t out_channels, int64_t kernel, int64_t pad,
                                     int weight, int bias, size_t chunk_bytes);

// Non-overlapping max-pooling `window` x `window` over NHWC [height, width, channels].
std::unique_ptr<Layer> MakeMaxPoolLayer(int64_t height, int64_t width, int64_t channels,
                                        int64_t window);

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_MODELS_LAYERS_H_
