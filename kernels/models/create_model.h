// Builds a Model from a job's ModelSpec (proto/job.proto).
//
//   kind            layers and parameter tables (W: [in, out] row-major, b: [out])
//   "softmax"       linear/weight [input_dim, C], linear/bias [C]
//   "mlp"           fc1..fcL (hidden widths, each followed by the activation), then out
//   "cnn"           28x28x1 images (input_dim = s*s, s a multiple of 4): conv1 5x5 pad 2 ->
//                   act -> maxpool 2 -> conv2 5x5 pad 2 -> act -> maxpool 2 -> fc1 (hidden[0],
//                   default 128) -> act -> out. conv_channels default {16, 32}. Activations are
//                   NHWC; conv weights are [out_channels, 5, 5, in_channels].
//   "sparse_linear" embedding_dim == 0: sparse/weight (sparse, row width C) summed over the
//                   example's weighted features, + sparse/bias [C]: a hashed linear model.
//                   embedding_dim E > 0: embedding/weight (sparse, width E) bag + embedding/bias
//                   [E], then fc1..fcL over the hidden widths (each with the activation), then
//                   out. input_dim, when > 0, is the key space (feature ids must be below it).
//   "graph"         the layers of ModelSpec.layers (graph_spec.h, graph_model.h).
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
};

// REQUIRES: backend outlives the model.
absl::StatusOr<std::unique_ptr<Model>> CreateModel(const v1::ModelSpec& spec, Backend* backend,
                                                   const ModelOptions& options = ModelOptions());

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_MODELS_CREATE_MODEL_H_
