#include "kernels/models/sequential_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace pscluster::kernels {
namespace {

constexpr int64_t kMaxNnz = (int64_t{1} << 31) - 1;  // CSR offsets are int32 on the device.

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

}  // namespace

SequentialModel::SequentialModel(Backend* backend, ModelConfig config)
    : backend_(backend), config_(std::move(config)), io_(backend), workspace_(backend) {
  for (size_t i = 0; i < config_.params.size(); ++i) {
    if (config_.params[i].sparse) sparse_param_ = static_cast<int>(i);
  }
}

absl::Status SequentialModel::ValidateBatch(const Batch& b) const {
  const int64_t n = b.num_examples;
  if (n < 1) return Invalid(absl::StrCat("batch.num_examples = ", n, " must be >= 1"));
  if (static_cast<int64_t>(b.labels.size()) != n) {
    return Invalid(absl::StrCat("batch.labels has ", b.labels.size(), " entries, want ", n));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (b.labels[i] < 0 || b.labels[i] >= config_.num_classes) {
      return Invalid(absl::StrCat("batch.labels[", i, "] = ", b.labels[i], " is outside [0, ",
                                  config_.num_classes, ")"));
    }
  }
  if (config_.input_kind == InputKind::kDense) {
    if (static_cast<uint64_t>(b.dense.size()) != static_cast<uint64_t>(n * config_.input_dim)) {
      return Invalid(absl::StrCat("batch.dense has ", b.dense.size(), " floats, want ", n, " x ",
                                  config_.input_dim, " for model '", config_.kind, "'"));
    }
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(b.offsets.size()) != n + 1) {
    return Invalid(absl::StrCat("batch.offsets has ", b.offsets.size(), " entries, want ", n + 1,
                                " (model '", config_.kind, "' takes sparse input)"));
  }
  if (b.values.size() != b.keys.size()) {
    return Invalid(absl::StrCat("batch.values has ", b.values.size(), " entries but batch.keys has ",
                                b.keys.size()));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (b.offsets[i + 1] < b.offsets[i]) {
      return Invalid(absl::StrCat("batch.offsets decreases at ", i + 1));
    }
  }
  if (b.offsets[n] > b.keys.size()) {
    return Invalid(absl::StrCat("batch.offsets[", n, "] = ", b.offsets[n], " exceeds the ",
                                b.keys.size(), " keys"));
  }
  if (static_cast<int64_t>(b.offsets[n] - b.offsets[0]) > kMaxNnz) {
    return Invalid("batch has 2^31 or more sparse entries");
  }
  if (sparse_param_ >= 0) {
    const uint64_t key_space = config_.params[sparse_param_].key_space;
    if (key_space > 0) {
      for (uint64_t j = b.offsets[0]; j < b.offsets[n]; ++j) {
        if (b.keys[j] >= key_space) {
          return Invalid(absl::StrCat("batch.keys[", j, "] = ", b.keys[j],
                                      " is outside the model's key space [0, ", key_space, ")"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SequentialModel::ValidateParams(const ParamValues& p, const Gradients* g) const {
  return ValidateParamLayout(config_.params, p, g);
}

absl::StatusOr<std::vector<std::vector<uint64_t>>> SequentialModel::SparseKeys(
    const Batch& batch) const {
  KERNELS_RETURN_IF_ERROR(ValidateBatch(batch));
  std::vector<std::vector<uint64_t>> keys(config_.params.size());
  if (sparse_param_ < 0) return keys;
  std::vector<uint64_t>& k = keys[sparse_param_];
  k.assign(batch.keys.begin() + batch.offsets[0],
           batch.keys.begin() + batch.offsets[batch.num_examples]);
  std::sort(k.begin(), k.end());
  k.erase(std::unique(k.begin(), k.end()), k.end());
  return keys;
}

absl::Status SequentialModel::MapSparseInput(const Batch& batch, const ParamValues& params) {
  const int64_t n = batch.num_examples;
  const uint64_t base = batch.offsets[0];
  host_offsets_.resize(n + 1);
  for (int64_t i = 0; i <= n; ++i) host_offsets_[i] = static_cast<int32_t>(batch.offsets[i] - base);
  const int64_t nnz = host_offsets_[n];
  absl::Span<const uint64_t> keys = params.keys[sparse_param_];
  host_rows_.resize(nnz);
  for (int64_t j = 0; j < nnz; ++j) {
    const uint64_t key = batch.keys[base + j];
    auto it = std::lower_bound(keys.begin(), keys.end(), key);
    if (it == keys.end() || *it != key) {
      const int64_t example =
          std::upper_bound(host_offsets_.begin(), host_offsets_.end(), static_cast<int32_t>(j)) -
          host_offsets_.begin() - 1;
      return Invalid(absl::StrCat("params.keys[", sparse_param_, "] (",
                                  config_.params[sparse_param_].name, ") lacks key ", key,
                                  " used by example ", example));
    }
    host_rows_[j] = static_cast<int32_t>(it - keys.begin());
  }
  return absl::OkStatus();
}

absl::Status SequentialModel::TrainStep(const Batch& batch, const ParamValues& params,
                                        const Gradients& grads, StepResult* result) {
  return Run(batch, params, &grads, result);
}

absl::Status SequentialModel::Evaluate(const Batch& batch, const ParamValues& params,
                                       StepResult* result) {
  return Run(batch, params, nullptr, result);
}

absl::Status SequentialModel::EvaluateScores(const Batch& batch, const ParamValues& params,
                                             StepResult* result, std::vector<float>* scores) {
  if (config_.num_classes != 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "scores need a two-class model; '", config_.kind, "' has ", config_.num_classes));
  }
  return Run(batch, params, nullptr, result, scores);
}

absl::Status SequentialModel::Run(const Batch& batch, const ParamValues& params,
                                  const Gradients* grads, StepResult* result,
                                  std::vector<float>* scores) {
  KERNELS_RETURN_IF_ERROR(ValidateBatch(batch));
  KERNELS_RETURN_IF_ERROR(ValidateParams(params, grads));
  const int64_t n = batch.num_examples;
  const int64_t classes = config_.num_classes;
  const size_t num_params = config_.params.size();
  const bool sparse = config_.input_kind == InputKind::kSparse;
  if (sparse) KERNELS_RETURN_IF_ERROR(MapSparseInput(batch, params));

  // ---- One copy in: parameters, the batch, labels. Outputs: gradients and the stats. ----
  io_.Begin();
  std::vector<int> param_slots(num_params), grad_slots;
  for (size_t i = 0; i < num_params; ++i) {
    param_slots[i] = io_.AddInput(params.values[i].data(), params.values[i].size() * sizeof(float));
  }
  int dense_slot = -1, offsets_slot = -1, rows_slot = -1, weights_slot = -1;
  int64_t nnz = 0;
  if (sparse) {
    nnz = host_offsets_[n];
    offsets_slot = io_.AddInput(host_offsets_.data(), host_offsets_.size() * sizeof(int32_t));
    rows_slot = io_.AddInput(host_rows_.data(), host_rows_.size() * sizeof(int32_t));
    weights_slot = io_.AddInput(batch.values.data() + batch.offsets[0], nnz * sizeof(float));
  } else {
    dense_slot = io_.AddInput(batch.dense.data(), batch.dense.size() * sizeof(float));
  }
  const int labels_slot = io_.AddInput(batch.labels.data(), n * sizeof(int32_t));
  if (grads != nullptr) {
    for (size_t i = 0; i < num_params; ++i) {
      grad_slots.push_back(
          io_.AddOutput(grads->values[i].data(), grads->values[i].size() * sizeof(float)));
    }
  }
  const int stats_slot = io_.AddOutput(host_stats_, sizeof(host_stats_));
  // The logits per example: one (a sigmoid head) or two (a two-class softmax).
  const int64_t logit_width = classes;
  int logits_slot = -1;
  if (scores != nullptr) {
    host_logits_.resize(n * logit_width);
    logits_slot = io_.AddOutput(host_logits_.data(), host_logits_.size() * sizeof(float));
  }
  KERNELS_RETURN_IF_ERROR(io_.Upload());

  // ---- Workspace: each layer's output, two gradient buffers, per-row loss, layer scratch. ----
  const size_t num_layers = config_.layers.size();
  std::vector<size_t> act_offset(num_layers), scratch_offset(num_layers);
  size_t bytes = 0;
  int64_t max_in = 0;
  for (size_t i = 0; i < num_layers; ++i) {
    act_offset[i] = bytes;
    bytes += AlignUp(sizeof(float) * n * config_.layers[i]->out_features());
    if (i > 0) max_in = std::max(max_in, config_.layers[i]->in_features());
  }
  const size_t grad_offset[2] = {bytes, bytes + AlignUp(sizeof(float) * n * max_in)};
  bytes = grad_offset[1] + AlignUp(sizeof(float) * n * max_in);
  const size_t row_stats_offset = bytes;
  bytes += AlignUp(sizeof(float) * 2 * n);
  for (size_t i = 0; i < num_layers; ++i) {
    scratch_offset[i] = bytes;
    bytes += AlignUp(config_.layers[i]->ScratchBytes(n));
  }
  KERNELS_RETURN_IF_ERROR(workspace_.Reserve(bytes));
  char* ws = workspace_.base();
  auto act = [&](size_t i) { return reinterpret_cast<float*>(ws + act_offset[i]); };

  LayerContext ctx;
  ctx.backend = backend_;
  ctx.n = n;
  ctx.params.resize(num_params);
  ctx.sparse_rows.assign(num_params, 0);
  for (size_t i = 0; i < num_params; ++i) {
    ctx.params[i] = static_cast<const float*>(io_.device(param_slots[i]));
    if (config_.params[i].sparse) ctx.sparse_rows[i] = params.keys[i].size();
  }
  for (int slot : grad_slots) ctx.grads.push_back(static_cast<float*>(io_.device(slot)));
  if (sparse) {
    ctx.sparse.offsets = static_cast<const int32_t*>(io_.device(offsets_slot));
    ctx.sparse.rows = static_cast<const int32_t*>(io_.device(rows_slot));
    ctx.sparse.weights = static_cast<const float*>(io_.device(weights_slot));
    ctx.sparse.nnz = nnz;
  }
  const float* input = sparse ? nullptr : static_cast<const float*>(io_.device(dense_slot));
  const auto* labels = static_cast<const int32_t*>(io_.device(labels_slot));

  // ---- Forward, loss, backward. ----
  for (size_t i = 0; i < num_layers; ++i) {
    KERNELS_RETURN_IF_ERROR(config_.layers[i]->Forward(ctx, i == 0 ? input : act(i - 1), act(i),
                                                       ws + scratch_offset[i]));
  }
  float* logits = act(num_layers - 1);
  float* row_stats = reinterpret_cast<float*>(ws + row_stats_offset);
  // The gradient of the (scaled) mean loss replaces the logits in place.
  const float grad_scale = (grads != nullptr ? grads->scale : 1.0f) / static_cast<float>(n);
  KERNELS_RETURN_IF_ERROR(backend_->SoftmaxCrossEntropy(
      n, classes, logits, labels, grad_scale,
      grads != nullptr ? logits : nullptr, row_stats));
  if (grads != nullptr) {
    const float* dout = logits;
    for (size_t k = num_layers; k-- > 0;) {
      float* din = k == 0 ? nullptr : reinterpret_cast<float*>(ws + grad_offset[k % 2]);
      KERNELS_RETURN_IF_ERROR(config_.layers[k]->Backward(ctx, k == 0 ? input : act(k - 1),
                                                          act(k), dout, din,
                                                          ws + scratch_offset[k]));
      dout = din;
    }
  }
  KERNELS_RETURN_IF_ERROR(backend_->ColumnSum(n, 2, row_stats, false,
                                              static_cast<float*>(io_.device(stats_slot))));
  if (scores != nullptr) {
    KERNELS_RETURN_IF_ERROR(backend_->CopyOnDevice(logits, io_.device(logits_slot),
                                                   sizeof(float) * n * logit_width));
  }
  KERNELS_RETURN_IF_ERROR(io_.Download());
  if (scores != nullptr) {
    scores->resize(n);
    for (int64_t i = 0; i < n; ++i) {
      (*scores)[i] = logit_width == 1 ? host_logits_[i]
                                      : host_logits_[2 * i + 1] - host_logits_[2 * i];
    }
  }

  result->loss = host_stats_[0] / static_cast<double>(n);
  result->correct = static_cast<int64_t>(std::lround(host_stats_[1]));
  result->examples = n;
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
