// Builds a Model from a job's ModelSpec (proto/job.proto): kind "graph" from its layers
// (graph_spec.h, graph_model.h), and each named kind as a preset of the same graph, built by
// the same GraphModel (the tables keep the names below; W: [in, out] row-major, b: [out]):
//
//   kind            layers of the graph (then a softmax head over num_classes logits)
//   "softmax"       dense_input -> mlp widths [C], names [linear]: linear/weight [input_dim, C],
//                   linear/bias [C]
//   "mlp"           dense_input -> mlp widths [hidden..., C], names [fc1..fcL, out], the
//                   activation after each hidden layer
//   "cnn"           dense_input (28x28x1 images: input_dim = s*s, s a multiple of 4) -> conv2d
//                   conv1 (5x5, conv_channels[0], default 16, activation, max-pool 2) -> conv2d
//                   conv2 (conv_channels[1], default 32) -> mlp widths [hidden[0] (default
//                   128), C], names [fc1, out]. Activations are NHWC; conv weights are
//                   [out_channels, 5, 5, in_channels].
//   "sparse_linear" categorical_input (the example's weighted features, keys below input_dim
//                   when > 0) -> embedding_dim == 0: linear `sparse` of width C (sparse/weight,
//                   rows of C, zeros; sparse/bias [C]): a hashed linear model.
//                   embedding_dim E > 0: linear `embedding` of width E (embedding/weight rows
//                   of E, normal with stddev 1/sqrt(E); embedding/bias [E]) -> mlp widths
//                   [hidden..., C], names [fc1..fcL, out].
//
// activation: "relu" (default) or "gelu" (exact erf form). num_classes must be >= 2 and
// input_dim >= 1 for dense models (the worker fills both from the data set when the job leaves
// them 0). Anything else is INVALID_ARGUMENT naming the field.
#ifndef PSCLUSTER_KERNELS_MODELS_CREATE_MODEL_H_
#define PSCLUSTER_KERNELS_MODELS_CREATE_MODEL_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/models/model.h"
#include "proto/job.pb.h"

namespace pscluster::kernels {

struct ModelOptions {
  // Copied into every parameter's InitializerSpec.seed (the job's seed).
  uint64_t seed = 0;
  // Largest im2col matrix a conv layer builds at once; 0 = 4 MiB on the CPU (cache-sized
  // chunks of the batch) and 256 MiB on CUDA (usually the whole batch).
  size_t conv_chunk_bytes = 0;
  // On a device: each layer's gradients are copied back on the backend's download stream as
  // soon as backward has finished the layer, overlapping the rest of backward. False: every
  // gradient comes back with the step's other outputs, in one download after its ops (for
  // comparison). No effect where the backend shares host memory (CPU).
  bool layer_gradient_copies = true;
};

// REQUIRES: backend outlives the model.
absl::StatusOr<std::unique_ptr<Model>> CreateModel(const v1::ModelSpec& spec, Backend* backend,
                                                   const ModelOptions& options = ModelOptions());

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_MODELS_CREATE_MODEL_H_
