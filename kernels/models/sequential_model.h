// A Model that is a stack of layers ending in softmax cross-entropy: every model of
// create_model.h is one. Owns the device buffers it reuses across steps.
#ifndef PSCLUSTER_KERNELS_MODELS_SEQUENTIAL_MODEL_H_
#define PSCLUSTER_KERNELS_MODELS_SEQUENTIAL_MODEL_H_

#include <memory>
#include <string>
#include <vector>

#include "kernels/models/layers.h"
#include "kernels/models/model.h"
#include "kernels/models/step_io.h"

namespace pscluster::kernels {

struct ModelConfig {
  std::string kind;
  InputKind input_kind = InputKind::kDense;
  int64_t input_dim = 0;    // Dense models.
  int64_t num_classes = 0;
  std::vector<ParamInfo> params;
  // The first layer reads the input (dense features, or the sparse input for an embedding
  // bag); the last one produces num_classes logits.
  std::vector<std::unique_ptr<Layer>> layers;
};

class SequentialModel final : public Model {
 public:
  // REQUIRES: config is consistent (create_model.cc builds it); backend outlives the model.
  SequentialModel(Backend* backend, ModelConfig config);

  const std::string& kind() const override { return config_.kind; }
  InputKind input_kind() const override { return config_.input_kind; }
  int64_t input_dim() const override { return config_.input_dim; }
  int64_t num_classes() const override { return config_.num_classes; }
  const std::vector<ParamInfo>& params() const override { return config_.params; }
  Backend* backend() const override { return backend_; }

  absl::StatusOr<std::vector<std::vector<uint64_t>>> SparseKeys(
      const Batch& batch) const override;
  absl::Status TrainStep(const Batch& batch, const ParamValues& params, const Gradients& grads,
                         StepResult* result) override;
  absl::Status Evaluate(const Batch& batch, const ParamValues& params,
                        StepResult* result) override;
  absl::Status EvaluateScores(const Batch& batch, const ParamValues& params, StepResult* result,
                              std::vector<float>* scores) override;

 private:
  // `scores`, when non-null: the two-class scores of EvaluateScores.
  absl::Status Run(const Batch& batch, const ParamValues& params, const Gradients* grads,
                   StepResult* result, std::vector<float>* scores = nullptr);
  absl::Status ValidateBatch(const Batch& batch) const;
  absl::Status ValidateParams(const ParamValues& params, const Gradients* grads) const;
  // Sparse input: CSR offsets rebased to 0 and each entry's row in the key list, on the host.
  absl::Status MapSparseInput(const Batch& batch, const ParamValues& params);

  Backend* const backend_;
  const ModelConfig config_;
  int sparse_param_ = -1;  // The sparse table the embedding bag reads (sparse models).

  StepIO io_;
  Workspace workspace_;
  std::vector<int32_t> host_offsets_;
  std::vector<int32_t> host_rows_;
  float host_stats_[2] = {0, 0};  // (loss sum, correct count) from the device.
  std::vector<float> host_logits_;  // EvaluateScores: the logits, from the device.
};

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_MODELS_SEQUENTIAL_MODEL_H_
