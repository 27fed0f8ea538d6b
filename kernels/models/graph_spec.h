// A `graph` model's layers (ModelSpec.layers, kind "graph") checked and resolved into a plan:
// each layer's inputs as indices, its output shape and its parameter tables. Pure (no backend,
// no I/O): the scheduler checks a job file with it, the worker builds a GraphModel from it.
//
// Layers, each reading only layers listed before it; the last one is the head and every other
// layer must lead to it:
//   dense_input        the data's dense features: [batch, input_dim]
//   categorical_input  the data's categorical fields (`fields`: a subset by name, default all);
//                      with no fields in the data (libsvm), one multi-valued field "features"
//                      of every key with its value as weight. Read only by embedding and linear.
//   embedding          per field, a `width`-wide row of the field's table (`table` set: one
//                      table of that name for every field, shared with other embedding layers
//                      naming it; else one table "<layer>/<field>" per field, keyed by key - base);
//                      a multi-valued field combines its rows weighted by value, `combiner` sum or
//                      mean. Output [batch, fields, width] ([batch, fields * width] with flatten).
//   linear             the wide part: sum over the input's keys of value * row of the sparse
//                      table "<layer>/weight" (`width` outputs per key, default 1) + bias
//                      "<layer>/bias". Output [batch, width].
//   concat             the inputs side by side; vectors of one width stay vectors
//                      ([batch, V1 + V2, w]), else [batch, total features].
//   mlp                fully connected layers "<layer>/fc<i>/{weight,bias}" (or "<names[i]>/...")
//                      of `widths`, each but the last followed by `activation` (relu or gelu; the
//                      last too with output_activation). Output [batch, widths.back()].
//   conv2d             a 2-D convolution "<layer>/{weight,bias}" of a square image (a
//                      dense_input of side^2 features, one channel, or a conv2d's output) to
//                      `channels`, a `kernel` x `kernel` kernel (odd, default 5) with zero padding,
//                      then `activation`, then max-pooling `pool` x `pool` (default 2; 1 = none).
//                      Output [batch, side/pool * side/pool * channels] (NHWC).
//   fm                 factorization-machine pairwise term over the input's vectors: [batch, 1].
//   dot_interaction    DLRM's pairwise dot products of the input's vectors: [batch, V (V - 1) / 2].
//   add                elementwise sum of inputs of equal size.
//   softmax / sigmoid  heads: cross-entropy over num_classes logits / binary cross-entropy over
//                      one logit (num_classes 2).
// Errors are INVALID_ARGUMENT "model.layers[i].key: message".
#ifndef PSCLUSTER_KERNELS_MODELS_GRAPH_SPEC_H_
#define PSCLUSTER_KERNELS_MODELS_GRAPH_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace pscluster::kernels {

enum class NodeType {
  kDenseInput,
  kCategoricalInput,
  kEmbedding,
  kLinear,
  kConcat,
  kMlp,
  kConv2d,
  kFm,
  kDotInteraction,
  kAdd,
  kSoftmax,
  kSigmoid,
};

// A sparse parameter table of the plan.
struct GraphTable {
  std::string name;
  int64_t width = 0;
  uint64_t key_space = 0;  // Keys (after rebasing) are below it; 0 = any.
  bool zero_init = false;  // linear: zeros; embedding: normal.
  float init_stddev = 0;   // > 0: normal with this stddev (LayerSpec.init_stddev).
};

struct GraphNode {
  NodeType type = NodeType::kDenseInput;
  std::string name;
  std::vector<int> inputs;  // Node indices, all lower.
  // Output [batch, vectors, width]; -1 where not known yet (the data's sizes at submission).
  int64_t vectors = -1;
  int64_t width = -1;
  // categorical_input: indices into ModelSpec.input_fields (empty with `multi_valued`).
  std::vector<int> fields;
  bool multi_valued = false;
  // embedding: one table per field (indices into GraphPlan::tables, per field of the input), or
  // one shared table. linear: its table.
  std::vector<int> tables;
  bool shared_table = false;
  bool mean = false;  // Combiner.
  // An image (dense_input when its features are a square, conv2d): side x side x channels,
  // NHWC. 0: not an image.
  int64_t side = 0;
  int64_t channels = 0;
  int64_t features() const { return vectors < 0 || width < 0 ? -1 : vectors * width; }
};

struct GraphPlan {
  std::vector<GraphNode> nodes;  // ModelSpec.layers, in order; the last is the head.
  std::vector<GraphTable> tables;
};

// `data_known`: input_dim, input_fields and key_space describe the data (the worker); false at
// submission, where they are unknown and the checks that need them are left to the worker.
absl::StatusOr<GraphPlan> PlanGraph(const v1::ModelSpec& spec, bool data_known);

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_MODELS_GRAPH_SPEC_H_
