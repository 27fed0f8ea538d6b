// A Model built from a layer graph (ModelSpec kind "graph", see graph_spec.h) on the backend's
// ops, so that it runs on the CPU and CUDA alike. Parameters: the plan's sparse tables (one per
// embedding field or shared, one per linear layer) and each mlp's and linear layer's dense tables.
//
// A batch carries the data's dense features (model.input_dim per example) and its categorical
// keys in CSR: with model.input_fields, exactly one key per field per example, in field order,
// within the field's range; without (libsvm), any number of keys below model.key_space (0 = any),
// each weighted by its value. Keys of a per-field table are rebased to the field (key - base).
//
// Thread model: as Model.
#ifndef PSCLUSTER_KERNELS_MODELS_GRAPH_MODEL_H_
#define PSCLUSTER_KERNELS_MODELS_GRAPH_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/models/graph_spec.h"
#include "kernels/models/layers.h"
#include "kernels/models/model.h"
#include "kernels/models/param_prefetch.h"
#include "kernels/models/step_graphs.h"
#include "kernels/models/step_io.h"
#include "proto/job.pb.h"

namespace pscluster::kernels {

class GraphModel final : public Model {
 public:
  // INVALID_ARGUMENT "model.layers[i].key: ..." when the graph does not fit the spec's data.
  // REQUIRES: backend outlives the model.
  // `kind`: what kind() reports (a preset's name, create_model.h). `conv_chunk_bytes`: the
  // largest im2col matrix a conv2d layer builds at once (0 = 4 MiB on the CPU, 256 MiB on CUDA).
  // `layer_gradient_copies`: ModelOptions::layer_gradient_copies.
  static absl::StatusOr<std::unique_ptr<GraphModel>> Create(const v1::ModelSpec& spec,
                                                            Backend* backend, uint64_t seed,
                                                            const std::string& kind = "graph",
                                                            size_t conv_chunk_bytes = 0,
                                                            bool layer_gradient_copies = true);

  const std::string& kind() const override { return kind_; }
  // Reads both kinds of input; kSparse when it reads categorical keys at all.
  InputKind input_kind() const override { return input_kind_; }
  int64_t input_dim() const override { return input_dim_; }
  int64_t num_classes() const override { return num_classes_; }
  const std::vector<ParamInfo>& params() const override { return params_; }
  Backend* backend() const override { return backend_; }

  absl::StatusOr<std::vector<std::vector<uint64_t>>> SparseKeys(
      const Batch& batch) const override;
  absl::Status TrainStep(const Batch& batch, const ParamValues& params, const Gradients& grads,
                         StepResult* result) override;
  absl::Status StartTrainStep(const Batch& batch, const ParamValues& params,
                              const Gradients& grads) override;
  absl::Status FinishStep(StepResult* result) override;
  absl::Status PrefetchParams(const ParamValues& next) override;
  absl::Status Evaluate(const Batch& batch, const ParamValues& params,
                        StepResult* result) override;
  absl::Status EvaluateScores(const Batch& batch, const ParamValues& params, StepResult* result,
                              std::vector<float>* scores) override;

  // Steps run plainly, recorded and replayed while recording is enabled (all zero on a backend
  // that does not record), and why recording stopped, if it did.
  const StepGraphs& step_graphs() const { return graphs_; }
  // Uploads of later steps' parameters queued by PrefetchParams, and steps that used one.
  const ParamPrefetch& param_prefetch() const { return prefetch_; }

 private:
  // One EmbeddingBag call: the bags it forms from a categorical input and the table it reads.
  struct Bags {
    int node = 0;      // The embedding or linear node.
    int param = 0;     // Sparse parameter index.
    uint64_t rebase = 0;  // Subtracted from keys (per-field tables).
    int slot = -1;     // -1: every selected field of an example in one bag per example (or, for
                       // a shared embedding, one bag per field); else only this field position.
    bool per_field = false;  // One bag per (example, field): a shared embedding table.
    // Built on the host each step, then on the device.
    std::vector<int32_t> offsets, rows;
    std::vector<float> weights;
    const int32_t* d_offsets = nullptr;
    const int32_t* d_rows = nullptr;
    const float* d_weights = nullptr;
  };
  // The layers an mlp or a conv2d node runs, one after the other.
  struct Stack {
    std::vector<std::unique_ptr<Layer>> layers;
    std::vector<int64_t> widths;  // Each sublayer's output features.
    int64_t max_width = 0;        // The input's features, or the widest sublayer's.
  };

  // A step queued by Start() and not yet finished by Finish().
  struct InFlight {
    bool active = false;
    int64_t n = 0;
    int64_t logit_width = 0;
    std::vector<float>* scores = nullptr;
    bool took_prefetch = false;  // Its parameters came from ParamPrefetch.
    bool async_grads = false;    // Its gradients come back on the download stream.
  };

  GraphModel(Backend* backend, const v1::ModelSpec& spec, GraphPlan plan, std::string kind)
      : backend_(backend),
        spec_(spec),
        plan_(std::move(plan)),
        kind_(std::move(kind)),
        io_(backend),
        workspace_(backend),
        graphs_(backend),
        prefetch_(backend) {}

  absl::Status Build(uint64_t seed, size_t conv_chunk_bytes);
  absl::Status ValidateBatch(const Batch& batch) const;
  absl::Status ValidateParams(const ParamValues& params, const Gradients* grads) const;
  // Calls f(key position in batch.keys, weight) for the entries of bag `b`'s example i (field
  // position s of the input when per_field).
  template <typename F>
  void ForEntries(const Bags& b, const Batch& batch, int64_t i, int s, F&& f) const;
  absl::Status MapBags(const Batch& batch, const ParamValues& params);
  // Queues a step: its uploads, its ops and (training, on a device) its gradients' downloads.
  // `scores`, when non-null: the two-class scores of EvaluateScores. On failure, waits for
  // whatever it queued.
  absl::Status Start(const Batch& batch, const ParamValues& params, const Gradients* grads,
                     std::vector<float>* scores = nullptr);
  absl::Status Queue(const Batch& batch, const ParamValues& params, const Gradients* grads,
                     std::vector<float>* scores);
  // Waits for the step Start() queued; its outputs are then in host memory.
  absl::Status Finish(StepResult* result);
  // After a failure: waits for every stream the step used (errors ignored) and forgets the
  // pending prefetch, whose upload may be among what failed.
  void Abandon();
  // Makes grad_events_ hold at least `count` events.
  absl::Status GrowGradEvents(size_t count);
  // Queues on the download stream each gradient's copy from `device` to `grads`, after the
  // event of the group in `ready` that completes it; then records grads_done_.
  absl::Status QueueGradientCopies(const std::vector<std::vector<int>>& ready,
                                   const std::vector<float*>& device, const Gradients& grads);

  Backend* const backend_;
  const v1::ModelSpec spec_;
  const GraphPlan plan_;
  const std::string kind_;
  bool layer_gradient_copies_ = true;
  InputKind input_kind_ = InputKind::kDense;
  int64_t input_dim_ = 0;
  int64_t num_classes_ = 2;
  bool reads_dense_ = false;
  bool reads_keys_ = false;
  std::vector<ParamInfo> params_;
  std::vector<int> table_param_;  // Plan table -> parameter index.
  std::vector<int> linear_bias_;  // Per node: the linear layer's bias parameter (else -1).
  std::vector<Stack> stacks_;     // Per node (empty but for mlp and conv2d).
  std::vector<Bags> bags_;

  StepIO io_;
  Workspace workspace_;
  StepGraphs graphs_;
  ParamPrefetch prefetch_;
  InFlight step_;
  // Per-layer gradient downloads: events on the op stream where layers' gradients are complete
  // (grown as needed), and the download stream's event after a step's last gradient copy.
  std::vector<Event> grad_events_;
  Event grads_done_;
  float host_stats_[2] = {0, 0};
  std::vector<float> host_logits_;  // EvaluateScores: the logits, from the device.
};

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_MODELS_GRAPH_MODEL_H_
