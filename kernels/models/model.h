// Models built on the backend ops, with parameters as named tensors that map 1:1 to
// parameter-server tables. Create one with CreateModel() (create_model.h).
//
// One training step, as a worker runs it:
//   1. keys = model.SparseKeys(batch)          sorted unique keys per sparse table (dense: empty)
//   2. pull every dense table whole, and the rows `keys[i]` of each sparse table i, into host
//      float buffers (a sparse table's rows as [keys[i].size() x row_width], in key order);
//   3. model.TrainStep(batch, {values, keys}, grads, &result)
//      writes grads.scale * d(mean loss)/d(param) into `grads`, laid out like the values;
//   4. push the gradients (a sparse table's gradient rows are for the same keys).
// Evaluate() is step 3 without gradients, for test sets.
//
// Parameters, gradients and batches live in host memory. The CUDA path keeps its device buffers
// across steps (they grow with the largest batch seen), moves the small inputs to the device in
// one copy and each large one straight from the caller's memory (a DMA transfer when that memory
// is page-locked, e.g. a kernels::HostArray), and brings the outputs back the same way; but each
// layer's gradients go back on a copy stream of their own as soon as backward has finished the
// layer, and parameters given to PrefetchParams() while the previous step computes are already
// on the device when their step starts.
//
// Thread model: a Model is not thread-safe and uses its Backend exclusively while a call runs.
// Bad input (shapes, labels, CSR offsets, keys) is INVALID_ARGUMENT naming the field; it never
// crashes the process.
#ifndef PSCLUSTER_KERNELS_MODELS_MODEL_H_
#define PSCLUSTER_KERNELS_MODELS_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "proto/job.pb.h"

namespace pscluster::kernels {

// One parameter tensor = one parameter-server table.
struct ParamInfo {
  std::string name;              // Table name, e.g. "fc1/weight"; unique within the model.
  bool sparse = false;           // Sparse: rows keyed by uint64, created on first touch.
  std::vector<int64_t> shape;    // Dense: the tensor's shape, row-major.
  int64_t row_width = 0;         // Sparse: floats per row.
  uint64_t key_space = 0;        // Sparse: keys must be < key_space (0 = any uint64).
  // How values start. Always concrete (ZEROS, UNIFORM or NORMAL): Glorot and He scales are
  // resolved here from the layer's own fans, so no server needs a shape convention.
  v1::InitializerSpec init;
  // The rule `init` was resolved from (GLOROT_UNIFORM, HE_NORMAL, NORMAL or ZEROS), and the
  // fans used (0 where they do not apply). For logs and docs.
  v1::InitializerSpec::Kind init_rule = v1::InitializerSpec::ZEROS;
  int64_t fan_in = 0;
  int64_t fan_out = 0;

  // Dense: product of shape. Sparse: row_width.
  int64_t num_elements() const;
};

// The most entries of one CSR batch or one sparse table's keys: device offsets are int32.
inline constexpr int64_t kMaxModelNnz = (int64_t{1} << 31) - 1;

struct ParamValues;
struct Gradients;
// Checks that `p` (and `g`, when not null) are laid out for `params`: one entry per parameter,
// a sparse table's keys strictly increasing and fewer than kMaxModelNnz, every value span the
// size its parameter needs. INVALID_ARGUMENT names the entry and the parameter.
absl::Status ValidateParamLayout(const std::vector<ParamInfo>& params, const ParamValues& p,
                                 const Gradients* g);

enum class InputKind { kDense, kSparse };

// A batch of examples, in host memory.
struct Batch {
  int64_t num_examples = 0;
  // Dense input: num_examples x input_dim floats, row-major.
  absl::Span<const float> dense;
  // Sparse input (CSR): example i has the features keys[offsets[i] .. offsets[i+1]) with
  // weights values[same range]. offsets has num_examples + 1 non-decreasing entries, the last
  // at most keys.size(); values.size() == keys.size(). Keys may repeat within an example.
  absl::Span<const uint64_t> offsets;
  absl::Span<const uint64_t> keys;
  absl::Span<const float> values;
  // num_examples labels, each in [0, num_classes).
  absl::Span<const int32_t> labels;
};

// One step's parameter values, indexed like Model::params().
struct ParamValues {
  // Dense: num_elements() floats. Sparse: keys[i].size() * row_width floats, rows in key order.
  std::vector<absl::Span<const float>> values;
  // Sparse: strictly increasing keys, covering every key the batch uses (SparseKeys() gives
  // exactly those; a superset is fine). Dense: empty.
  std::vector<absl::Span<const uint64_t>> keys;
};

// Where TrainStep writes scale * d(mean loss)/d(param); same sizes and layout as
// ParamValues::values. The scale enters once, in the loss's gradient on the device, so a caller
// that weighs its gradient (a rank's share of an aggregated step) needs no pass of its own.
struct Gradients {
  std::vector<absl::Span<float>> values;
  float scale = 1.0f;
};

struct StepResult {
  double loss = 0;       // Mean cross-entropy over the batch.
  int64_t correct = 0;   // Examples whose highest logit is the label (lowest class on ties).
  int64_t examples = 0;  // num_examples.
};

class Model {
 public:
  virtual ~Model() = default;

  // "softmax", "mlp", "cnn", "sparse_linear" or "graph" (ModelSpec.kind).
  virtual const std::string& kind() const = 0;
  virtual InputKind input_kind() const = 0;
  // Dense input features per example (0 for sparse models).
  virtual int64_t input_dim() const = 0;
  virtual int64_t num_classes() const = 0;
  virtual const std::vector<ParamInfo>& params() const = 0;
  virtual Backend* backend() const = 0;

  // Per params() index, the sorted unique keys `batch` touches in that sparse table (empty
  // for dense tables).
  virtual absl::StatusOr<std::vector<std::vector<uint64_t>>> SparseKeys(
      const Batch& batch) const = 0;

  // Forward and backward over the batch: loss, correct count and every parameter's gradient.
  // StartTrainStep() and FinishStep() in one.
  virtual absl::Status TrainStep(const Batch& batch, const ParamValues& params,
                                 const Gradients& grads, StepResult* result) = 0;

  // A training step in two halves, so that the caller can do something while the device
  // computes (on the CPU the step runs in the first half):
  //   StartTrainStep()  checks the inputs and queues the step: its uploads, ops and gradient
  //                     copies (on a device each layer's gradients go back as soon as backward
  //                     has finished that layer). On return the batch's memory is free again.
  //   FinishStep()      waits for the step; `grads` and `result` are valid after it. Errors of
  //                     the step's asynchronous work (a kernel's, a copy's) are its status.
  // REQUIRES: `params` and `grads` stay valid and unchanged until FinishStep() returns; one
  // step in flight at a time (FAILED_PRECONDITION otherwise; TrainStep and Evaluate too).
  virtual absl::Status StartTrainStep(const Batch& batch, const ParamValues& params,
                                      const Gradients& grads) = 0;
  virtual absl::Status FinishStep(StepResult* result) = 0;
  // Queues the upload of a later step's parameters now (on a device: on a stream of its own,
  // into a second set of device buffers, so that it overlaps the step in flight); the next step
  // whose ParamValues are the same memory (each span's data() and size()) uses them instead of
  // uploading its own. A step with other memory leaves the prefetch waiting for its own.
  // Nothing happens where the backend shares host memory (CPU). Errors of the upload are the
  // status of the step in flight or of the step that uses it; a step that fails forgets the
  // prefetch. REQUIRES: `next`'s memory stays valid and unchanged until the step that uses it
  // has finished or the next PrefetchParams() returns.
  virtual absl::Status PrefetchParams(const ParamValues& next) = 0;
  // Forward only: loss and correct count.
  virtual absl::Status Evaluate(const Batch& batch, const ParamValues& params,
                                StepResult* result) = 0;
  // Evaluate, plus one score per example (`scores` resized to num_examples) that grows with the
  // model's belief in class 1: the logit of a sigmoid head, logit 1 - logit 0 of a two-class
  // softmax. What AUC ranks. FAILED_PRECONDITION for a model of more than two classes.
  virtual absl::Status EvaluateScores(const Batch& batch, const ParamValues& params,
                                      StepResult* result, std::vector<float>* scores) = 0;
};

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_MODELS_MODEL_H_
