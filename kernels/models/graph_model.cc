#include "kernels/models/graph_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace pscluster::kernels {
namespace {

using v1::InitializerSpec;

constexpr int64_t kMaxNnz = (int64_t{1} << 31) - 1;  // CSR offsets are int32 on the device.
constexpr int64_t kMaxParamElements = int64_t{1} << 31;

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

ParamInfo DenseParam(const std::string& name, std::vector<int64_t> shape,
                     InitializerSpec::Kind rule, int64_t fan_in, int64_t fan_out, uint64_t seed) {
  ParamInfo p;
  p.name = name;
  p.shape = std::move(shape);
  p.init_rule = rule;
  p.fan_in = fan_in;
  p.fan_out = fan_out;
  p.init.set_seed(seed);
  if (rule == InitializerSpec::GLOROT_UNIFORM) {
    const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
    p.init.set_kind(InitializerSpec::UNIFORM);
    p.init.set_low(static_cast<float>(-limit));
    p.init.set_high(static_cast<float>(limit));
  } else if (rule == InitializerSpec::HE_NORMAL) {
    p.init.set_kind(InitializerSpec::NORMAL);
    p.init.set_mean(0.0f);
    p.init.set_stddev(static_cast<float>(std::sqrt(2.0 / static_cast<double>(fan_in))));
  } else {
    p.init.set_kind(InitializerSpec::ZEROS);
  }
  return p;
}

bool IsInput(NodeType t) { return t == NodeType::kDenseInput || t == NodeType::kCategoricalInput; }
bool IsHead(NodeType t) { return t == NodeType::kSoftmax || t == NodeType::kSigmoid; }

}  // namespace

absl::StatusOr<std::unique_ptr<GraphModel>> GraphModel::Create(const v1::ModelSpec& spec,
                                                               Backend* backend, uint64_t seed,
                                                               const std::string& kind,
                                                               size_t conv_chunk_bytes,
                                                               bool layer_gradient_copies) {
  if (backend == nullptr) return Invalid("GraphModel: backend is null");
  auto plan = PlanGraph(spec, /*data_known=*/true);
  if (!plan.ok()) return plan.status();
  std::unique_ptr<GraphModel> model(new GraphModel(backend, spec, std::move(*plan), kind));
  model->layer_gradient_copies_ = layer_gradient_copies;
  KERNELS_RETURN_IF_ERROR(model->Build(seed, conv_chunk_bytes));
  return model;
}

absl::Status GraphModel::Build(uint64_t seed, size_t conv_chunk_bytes) {
  if (conv_chunk_bytes == 0) {
    conv_chunk_bytes = backend_->kind() == DeviceKind::kCpu ? size_t{4} << 20 : size_t{256} << 20;
  }
  const std::vector<GraphNode>& nodes = plan_.nodes;
  const GraphNode& head = nodes.back();
  num_classes_ = head.type == NodeType::kSigmoid ? 2 : spec_.num_classes();
  if (num_classes_ < 2) {
    return Invalid(absl::StrCat("model.num_classes = ", num_classes_, " must be >= 2"));
  }
  input_dim_ = spec_.input_dim();
  for (const GraphNode& n : nodes) {
    if (n.type == NodeType::kDenseInput) reads_dense_ = true;
    if (n.type == NodeType::kCategoricalInput) reads_keys_ = true;
  }
  if (!reads_dense_) input_dim_ = 0;
  input_kind_ = reads_keys_ ? InputKind::kSparse : InputKind::kDense;

  for (const GraphTable& t : plan_.tables) {
    ParamInfo p;
    p.name = t.name;
    p.sparse = true;
    p.row_width = t.width;
    p.key_space = t.key_space;
    p.init.set_seed(seed);
    if (t.zero_init && t.init_stddev == 0) {
      p.init_rule = InitializerSpec::ZEROS;
      p.init.set_kind(InitializerSpec::ZEROS);
    } else {
      p.init_rule = InitializerSpec::NORMAL;
      p.init.set_kind(InitializerSpec::NORMAL);
      p.init.set_mean(0.0f);
      p.init.set_stddev(t.init_stddev > 0
                            ? t.init_stddev
                            : static_cast<float>(0.1 / std::sqrt(static_cast<double>(t.width))));
    }
    table_param_.push_back(static_cast<int>(params_.size()));
    params_.push_back(std::move(p));
  }
  linear_bias_.assign(nodes.size(), -1);
  stacks_.resize(nodes.size());
  for (size_t k = 0; k < nodes.size(); ++k) {
    const GraphNode& n = nodes[k];
    const v1::LayerSpec& l = spec_.layers(static_cast<int>(k));
    if (n.type == NodeType::kLinear) {
      linear_bias_[k] = static_cast<int>(params_.size());
      params_.push_back(DenseParam(n.name + "/bias", {n.width}, InitializerSpec::ZEROS, 0, 0, seed));
    }
    const Activation f = l.activation() == "gelu" ? Activation::kGelu : Activation::kRelu;
    if (n.type == NodeType::kConv2d) {
      // Convolution, activation, max-pooling; weights [out_c, k, k, in_c], He-initialised.
      Stack& m = stacks_[k];
      const GraphNode& in = nodes[n.inputs[0]];
      const int64_t kernel = l.kernel() == 0 ? 5 : l.kernel();
      const int64_t pool = l.pool() == 0 ? 2 : l.pool();
      const int64_t side = in.side, in_c = in.channels, out_c = n.channels;
      const int w = static_cast<int>(params_.size());
      params_.push_back(DenseParam(n.name + "/weight", {out_c, kernel, kernel, in_c},
                                   InitializerSpec::HE_NORMAL, kernel * kernel * in_c,
                                   kernel * kernel * out_c, seed));
      params_.push_back(DenseParam(n.name + "/bias", {out_c}, InitializerSpec::ZEROS, 0, 0, seed));
      const int64_t conv_out = side * side * out_c;
      m.layers.push_back(
          MakeConvLayer(side, side, in_c, out_c, kernel, kernel / 2, w, w + 1, conv_chunk_bytes));
      m.widths.push_back(conv_out);
      m.layers.push_back(MakeActivationLayer(conv_out, f));
      m.widths.push_back(conv_out);
      if (pool > 1) {
        m.layers.push_back(MakeMaxPoolLayer(side, side, out_c, pool));
        m.widths.push_back(n.features());
      }
      m.max_width = std::max(in.features(), conv_out);
    }
    if (n.type == NodeType::kMlp) {
      Stack& m = stacks_[k];
      int64_t in = nodes[n.inputs[0]].features();
      m.max_width = in;
      for (int j = 0; j < l.widths_size(); ++j) {
        const int64_t out = l.widths(j);
        const bool act = j + 1 < l.widths_size() || l.output_activation();
        const std::string name =
            l.names_size() > 0 ? l.names(j) : absl::StrCat(n.name, "/fc", j + 1);
        const int w = static_cast<int>(params_.size());
        params_.push_back(DenseParam(name + "/weight", {in, out},
                                     act ? InitializerSpec::HE_NORMAL : InitializerSpec::GLOROT_UNIFORM,
                                     in, out, seed));
        params_.push_back(DenseParam(name + "/bias", {out}, InitializerSpec::ZEROS, 0, 0, seed));
        m.layers.push_back(MakeDenseLayer(in, out, w, w + 1));
        m.widths.push_back(out);
        if (act) {
          m.layers.push_back(MakeActivationLayer(out, f));
          m.widths.push_back(out);
        }
        m.max_width = std::max(m.max_width, out);
        in = out;
      }
    }
    if (n.type == NodeType::kEmbedding || n.type == NodeType::kLinear) {
      const GraphNode& c = nodes[n.inputs[0]];
      if (n.type == NodeType::kLinear || n.shared_table || c.multi_valued) {
        Bags b;
        b.node = static_cast<int>(k);
        b.param = table_param_[n.tables[0]];
        b.per_field = n.type == NodeType::kEmbedding && !c.multi_valued;
        bags_.push_back(std::move(b));
      } else {
        for (size_t s = 0; s < c.fields.size(); ++s) {
          Bags b;
          b.node = static_cast<int>(k);
          b.param = table_param_[n.tables[s]];
          b.slot = static_cast<int>(s);
          b.rebase = spec_.input_fields(c.fields[s]).base();
          bags_.push_back(std::move(b));
        }
      }
    }
  }
  for (const ParamInfo& p : params_) {
    if (!p.sparse && p.num_elements() >= kMaxParamElements) {
      return Invalid(absl::StrCat("parameter ", p.name, " would have ", p.num_elements(),
                                  " elements; at most 2^31 - 1 per table"));
    }
  }
  return absl::OkStatus();
}

absl::Status GraphModel::ValidateBatch(const Batch& b) const {
  const int64_t n = b.num_examples;
  if (n < 1) return Invalid(absl::StrCat("batch.num_examples = ", n, " must be >= 1"));
  if (static_cast<int64_t>(b.labels.size()) != n) {
    return Invalid(absl::StrCat("batch.labels has ", b.labels.size(), " entries, want ", n));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (b.labels[i] < 0 || b.labels[i] >= num_classes_) {
      return Invalid(absl::StrCat("batch.labels[", i, "] = ", b.labels[i], " is outside [0, ",
                                  num_classes_, ")"));
    }
  }
  if (reads_dense_ &&
      static_cast<uint64_t>(b.dense.size()) != static_cast<uint64_t>(n * input_dim_)) {
    return Invalid(absl::StrCat("batch.dense has ", b.dense.size(), " floats, want ", n, " x ",
                                input_dim_, " for the graph's dense_input"));
  }
  if (!reads_keys_) return absl::OkStatus();
  if (static_cast<int64_t>(b.offsets.size()) != n + 1) {
    return Invalid(absl::StrCat("batch.offsets has ", b.offsets.size(), " entries, want ", n + 1,
                                " (the graph reads categorical keys)"));
  }
  if (b.values.size() != b.keys.size()) {
    return Invalid(absl::StrCat("batch.values has ", b.values.size(),
                                " entries but batch.keys has ", b.keys.size()));
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
  const int fields = spec_.input_fields_size();
  for (int64_t i = 0; i < n; ++i) {
    if (fields > 0) {
      if (b.offsets[i + 1] - b.offsets[i] != static_cast<uint64_t>(fields)) {
        return Invalid(absl::StrCat("batch example ", i, " has ", b.offsets[i + 1] - b.offsets[i],
                                    " keys, want one per field (", fields, ")"));
      }
      for (int f = 0; f < fields; ++f) {
        const v1::InputField& field = spec_.input_fields(f);
        const uint64_t key = b.keys[b.offsets[i] + f];
        if (key < field.base() || key - field.base() >= field.size()) {
          return Invalid(absl::StrCat("batch.keys[", b.offsets[i] + f, "] = ", key,
                                      " is outside field '", field.name(), "' [", field.base(),
                                      ", ", field.base() + field.size(), ")"));
        }
      }
    } else if (spec_.key_space() > 0) {
      for (uint64_t j = b.offsets[i]; j < b.offsets[i + 1]; ++j) {
        if (b.keys[j] >= spec_.key_space()) {
          return Invalid(absl::StrCat("batch.keys[", j, "] = ", b.keys[j],
                                      " is outside the model's key space [0, ", spec_.key_space(),
                                      ")"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GraphModel::ValidateParams(const ParamValues& p, const Gradients* g) const {
  return ValidateParamLayout(params_, p, g);
}

template <typename F>
void GraphModel::ForEntries(const Bags& b, const Batch& batch, int64_t i, int s, F&& f) const {
  const GraphNode& c = plan_.nodes[plan_.nodes[b.node].inputs[0]];
  const uint64_t base = batch.offsets[i];
  if (c.multi_valued) {
    for (uint64_t j = base; j < batch.offsets[i + 1]; ++j) f(j);
  } else if (b.per_field) {
    f(base + c.fields[s]);
  } else if (b.slot >= 0) {
    f(base + c.fields[b.slot]);
  } else {
    for (int field : c.fields) f(base + field);
  }
}

absl::StatusOr<std::vector<std::vector<uint64_t>>> GraphModel::SparseKeys(
    const Batch& batch) const {
  KERNELS_RETURN_IF_ERROR(ValidateBatch(batch));
  std::vector<std::vector<uint64_t>> keys(params_.size());
  for (const Bags& b : bags_) {
    std::vector<uint64_t>& k = keys[b.param];
    const GraphNode& c = plan_.nodes[plan_.nodes[b.node].inputs[0]];
    const int per_example = b.per_field ? static_cast<int>(c.fields.size()) : 1;
    for (int64_t i = 0; i < batch.num_examples; ++i) {
      for (int s = 0; s < per_example; ++s) {
        ForEntries(b, batch, i, s, [&](uint64_t j) { k.push_back(batch.keys[j] - b.rebase); });
      }
    }
  }
  for (std::vector<uint64_t>& k : keys) {
    std::sort(k.begin(), k.end());
    k.erase(std::unique(k.begin(), k.end()), k.end());
  }
  return keys;
}

absl::Status GraphModel::MapBags(const Batch& batch, const ParamValues& params) {
  for (Bags& b : bags_) {
    const GraphNode& node = plan_.nodes[b.node];
    const GraphNode& c = plan_.nodes[node.inputs[0]];
    const int per_example = b.per_field ? static_cast<int>(c.fields.size()) : 1;
    absl::Span<const uint64_t> keys = params.keys[b.param];
    b.offsets.assign(1, 0);
    b.rows.clear();
    b.weights.clear();
    absl::Status error;
    for (int64_t i = 0; i < batch.num_examples; ++i) {
      for (int s = 0; s < per_example; ++s) {
        const size_t first = b.rows.size();
        ForEntries(b, batch, i, s, [&](uint64_t j) {
          const uint64_t key = batch.keys[j] - b.rebase;
          auto it = std::lower_bound(keys.begin(), keys.end(), key);
          if (it == keys.end() || *it != key) {
            if (error.ok()) {
              error = Invalid(absl::StrCat("params.keys[", b.param, "] (", params_[b.param].name,
                                           ") lacks key ", key, " used by example ", i));
            }
            return;
          }
          b.rows.push_back(static_cast<int32_t>(it - keys.begin()));
          b.weights.push_back(batch.values[j]);
        });
        if (node.mean && b.rows.size() > first + 1) {
          const float scale = 1.0f / static_cast<float>(b.rows.size() - first);
          for (size_t j = first; j < b.rows.size(); ++j) b.weights[j] *= scale;
        }
        b.offsets.push_back(static_cast<int32_t>(b.rows.size()));
      }
    }
    if (!error.ok()) return error;
  }
  return absl::OkStatus();
}

absl::Status GraphModel::TrainStep(const Batch& batch, const ParamValues& params,
                                   const Gradients& grads, StepResult* result) {
  KERNELS_RETURN_IF_ERROR(Start(batch, params, &grads));
  return Finish(result);
}

absl::Status GraphModel::StartTrainStep(const Batch& batch, const ParamValues& params,
                                        const Gradients& grads) {
  return Start(batch, params, &grads);
}

absl::Status GraphModel::FinishStep(StepResult* result) { return Finish(result); }

absl::Status GraphModel::PrefetchParams(const ParamValues& next) {
  KERNELS_RETURN_IF_ERROR(ValidateParams(next, nullptr));
  return prefetch_.Prefetch(next.values);
}

absl::Status GraphModel::Evaluate(const Batch& batch, const ParamValues& params,
                                  StepResult* result) {
  KERNELS_RETURN_IF_ERROR(Start(batch, params, nullptr));
  return Finish(result);
}

absl::Status GraphModel::EvaluateScores(const Batch& batch, const ParamValues& params,
                                        StepResult* result, std::vector<float>* scores) {
  if (num_classes_ != 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("scores need a two-class model; this graph has ", num_classes_, " classes"));
  }
  KERNELS_RETURN_IF_ERROR(Start(batch, params, nullptr, scores));
  return Finish(result);
}

absl::Status GraphModel::Start(const Batch& batch, const ParamValues& params,
                               const Gradients* grads, std::vector<float>* scores) {
  if (step_.active) {
    return absl::FailedPreconditionError("a step is in flight: FinishStep() comes first");
  }
  KERNELS_RETURN_IF_ERROR(ValidateBatch(batch));
  KERNELS_RETURN_IF_ERROR(ValidateParams(params, grads));
  KERNELS_RETURN_IF_ERROR(MapBags(batch, params));
  step_ = InFlight();
  absl::Status queued = Queue(batch, params, grads, scores);
  if (!queued.ok()) {
    Abandon();
    return queued;
  }
  step_.active = true;
  return absl::OkStatus();
}

void GraphModel::Abandon() {
  if (step_.took_prefetch) prefetch_.Release().IgnoreError();
  backend_->Synchronize().IgnoreError();
  if (step_.async_grads && grads_done_.valid()) {
    // Whatever gradient copies were queued: once they are done, nothing writes the caller's
    // memory any more.
    if (backend_->RecordEvent(Stream::kDownload, grads_done_).ok()) {
      backend_->WaitForEvent(grads_done_).IgnoreError();
    }
  }
  prefetch_.Drop();
  step_ = InFlight();
}

absl::Status GraphModel::Finish(StepResult* result) {
  if (!step_.active) {
    return absl::FailedPreconditionError("FinishStep: no step in flight (StartTrainStep first)");
  }
  absl::Status done = io_.Download();
  if (step_.async_grads) {
    // The host waits for the last gradient copy alone: every other was queued before it.
    absl::Status copied = backend_->WaitForEvent(grads_done_);
    if (done.ok()) done = copied;
  }
  const InFlight step = step_;
  step_ = InFlight();
  if (!done.ok()) {
    prefetch_.Drop();
    return done;
  }
  const int64_t n = step.n;
  if (step.scores != nullptr) {
    step.scores->resize(n);
    for (int64_t i = 0; i < n; ++i) {
      (*step.scores)[i] = step.logit_width == 1
                              ? host_logits_[i]
                              : host_logits_[2 * i + 1] - host_logits_[2 * i];
    }
  }
  result->loss = host_stats_[0] / static_cast<double>(n);
  result->correct = static_cast<int64_t>(std::lround(host_stats_[1]));
  result->examples = n;
  return absl::OkStatus();
}

absl::Status GraphModel::Queue(const Batch& batch, const ParamValues& params,
                               const Gradients* grads, std::vector<float>* scores) {
  const int64_t n = batch.num_examples;
  const size_t num_params = params_.size();
  const std::vector<GraphNode>& nodes = plan_.nodes;
  const size_t count = nodes.size();
  const bool train = grads != nullptr;
  // On a device, gradients come back on the download stream, each as soon as backward has
  // finished its layer (or, when steps are recorded as graphs, after the step's ops).
  const bool async_grads = train && !backend_->shares_host_memory() && layer_gradient_copies_;
  step_.async_grads = async_grads;

  // ---- Parameters: uploaded ahead by PrefetchParams, or with the step's other inputs. ----
  std::vector<const float*> prefetched;
  KERNELS_ASSIGN_OR_RETURN(step_.took_prefetch, prefetch_.Take(params.values, &prefetched));
  const bool took = step_.took_prefetch;

  // ---- One copy in: parameters (unless prefetched), the batch, the bags, labels. Out:
  // gradients (unless they come back on the download stream) and stats. ----
  io_.Begin();
  std::vector<int> param_slots(num_params, -1), grad_slots;
  for (size_t i = 0; i < num_params && !took; ++i) {
    param_slots[i] = io_.AddInput(params.values[i].data(), params.values[i].size() * sizeof(float));
  }
  int dense_slot = -1;
  if (reads_dense_) {
    dense_slot = io_.AddInput(batch.dense.data(), batch.dense.size() * sizeof(float));
  }
  std::vector<int> bag_slots;
  for (const Bags& b : bags_) {
    bag_slots.push_back(io_.AddInput(b.offsets.data(), b.offsets.size() * sizeof(int32_t)));
    bag_slots.push_back(io_.AddInput(b.rows.data(), b.rows.size() * sizeof(int32_t)));
    bag_slots.push_back(io_.AddInput(b.weights.data(), b.weights.size() * sizeof(float)));
  }
  const int labels_slot = io_.AddInput(batch.labels.data(), n * sizeof(int32_t));
  if (train) {
    for (size_t i = 0; i < num_params; ++i) {
      const size_t bytes = grads->values[i].size() * sizeof(float);
      grad_slots.push_back(async_grads ? io_.AddDeviceOutput(bytes)
                                       : io_.AddOutput(grads->values[i].data(), bytes));
    }
  }
  const int stats_slot = io_.AddOutput(host_stats_, sizeof(host_stats_));
  // The logits per example: one (a sigmoid head) or two (a two-class softmax).
  const int64_t logit_width = nodes.back().type == NodeType::kSigmoid ? 1 : num_classes_;
  int logits_slot = -1;
  if (scores != nullptr) {
    host_logits_.resize(n * logit_width);
    logits_slot = io_.AddOutput(host_logits_.data(), host_logits_.size() * sizeof(float));
  }
  KERNELS_RETURN_IF_ERROR(io_.Upload());
  for (size_t i = 0; i < bags_.size(); ++i) {
    bags_[i].d_offsets = static_cast<const int32_t*>(io_.device(bag_slots[3 * i]));
    bags_[i].d_rows = static_cast<const int32_t*>(io_.device(bag_slots[3 * i + 1]));
    bags_[i].d_weights = static_cast<const float*>(io_.device(bag_slots[3 * i + 2]));
  }

  // ---- Workspace: outputs and gradients per node, mlp sublayers, a temporary, row stats. ----
  auto floats = [&](int64_t per_example) { return AlignUp(sizeof(float) * n * per_example); };
  size_t bytes = 0;
  std::vector<size_t> out_off(count, 0), grad_off(count, 0);
  std::vector<std::vector<size_t>> mlp_off(count), scratch_off(count);
  std::vector<size_t> mlp_grad_off(count, 0);
  int64_t max_features = 1;
  for (size_t k = 0; k < count; ++k) {
    const GraphNode& node = nodes[k];
    if (IsInput(node.type) || IsHead(node.type)) continue;
    max_features = std::max(max_features, node.features());
    out_off[k] = bytes;
    bytes += floats(node.features());
    if (train) {
      grad_off[k] = bytes;
      bytes += floats(node.features());
    }
    if (node.type == NodeType::kMlp || node.type == NodeType::kConv2d) {
      const Stack& m = stacks_[k];
      for (size_t j = 0; j + 1 < m.layers.size(); ++j) {
        mlp_off[k].push_back(bytes);
        bytes += floats(m.widths[j]);
      }
      for (const auto& layer : m.layers) {
        scratch_off[k].push_back(bytes);
        bytes += AlignUp(layer->ScratchBytes(n));
      }
      mlp_grad_off[k] = bytes;
      bytes += 2 * floats(m.max_width);
    }
  }
  if (reads_dense_) max_features = std::max(max_features, input_dim_);
  const size_t tmp_off = bytes;
  bytes += floats(max_features);
  const size_t stats_off = bytes;
  bytes += floats(2);
  KERNELS_RETURN_IF_ERROR(workspace_.Reserve(bytes));
  char* ws = workspace_.base();
  const float* dense_in = reads_dense_ ? static_cast<const float*>(io_.device(dense_slot)) : nullptr;
  auto out = [&](int k) -> float* {
    return nodes[k].type == NodeType::kDenseInput ? const_cast<float*>(dense_in)
                                                  : reinterpret_cast<float*>(ws + out_off[k]);
  };
  auto grad = [&](int k) { return reinterpret_cast<float*>(ws + grad_off[k]); };
  auto needs_grad = [&](int k) { return train && !IsInput(nodes[k].type); };
  float* tmp = reinterpret_cast<float*>(ws + tmp_off);
  float* row_stats = reinterpret_cast<float*>(ws + stats_off);

  LayerContext ctx;
  ctx.backend = backend_;
  ctx.n = n;
  ctx.params.resize(num_params);
  ctx.sparse_rows.assign(num_params, 0);
  for (size_t i = 0; i < num_params; ++i) {
    ctx.params[i] = took ? prefetched[i] : static_cast<const float*>(io_.device(param_slots[i]));
    if (params_[i].sparse) ctx.sparse_rows[i] = static_cast<int64_t>(params.keys[i].size());
  }
  for (int slot : grad_slots) ctx.grads.push_back(static_cast<float*>(io_.device(slot)));
  auto mlp_act = [&](int k, size_t j) {
    return j + 1 == stacks_[k].layers.size() ? out(k)
                                             : reinterpret_cast<float*>(ws + mlp_off[k][j]);
  };
  auto scratch = [&](int k, size_t j) { return static_cast<void*>(ws + scratch_off[k][j]); };

  // ---- The step's ops, queued by `enqueue` (or replayed from a recording, step_graphs.h). ----
  Backend* be = backend_;
  const GraphNode& head = nodes.back();
  const int logits_node = head.inputs[0];
  const float* logits = out(logits_node);
  const float grad_scale = (train ? grads->scale : 1.0f) / static_cast<float>(n);
  const auto* labels = static_cast<const int32_t*>(io_.device(labels_slot));
  float* dlogits = !train ? nullptr : IsInput(nodes[logits_node].type) ? tmp : grad(logits_node);
  // Gradients complete at points of backward: groups of parameters, each with an event recorded
  // on the op stream after the ops that finished them (not while recording a graph: recordings
  // hold no events).
  const bool per_layer = async_grads && !graphs_.enabled();
  std::vector<std::vector<int>> ready;
  auto grads_ready = [&](std::vector<int> group) -> absl::Status {
    if (!per_layer || group.empty()) return absl::OkStatus();
    KERNELS_RETURN_IF_ERROR(GrowGradEvents(ready.size() + 1));
    KERNELS_RETURN_IF_ERROR(be->RecordEvent(Stream::kOps, grad_events_[ready.size()]));
    ready.push_back(std::move(group));
    return absl::OkStatus();
  };
  auto enqueue = [&]() -> absl::Status {
    ready.clear();
    // ---- Forward. ----
    for (size_t kk = 0; kk + 1 < count; ++kk) {
      const int k = static_cast<int>(kk);
      const GraphNode& node = nodes[k];
      switch (node.type) {
        case NodeType::kDenseInput:
        case NodeType::kCategoricalInput:
        case NodeType::kSoftmax:
        case NodeType::kSigmoid:
          break;
        case NodeType::kEmbedding:
        case NodeType::kLinear: {
          const int64_t stride = node.features();
          for (const Bags& b : bags_) {
            if (b.node != k) continue;
            const int64_t w = params_[b.param].row_width;
            const int64_t bags = static_cast<int64_t>(b.offsets.size()) - 1;
            const bool direct = b.slot < 0 || stride == w;
            KERNELS_RETURN_IF_ERROR(be->EmbeddingBagForward(
                bags, w, static_cast<int64_t>(b.rows.size()), b.d_offsets, b.d_rows, b.d_weights,
                ctx.params[b.param], ctx.sparse_rows[b.param], direct ? out(k) : tmp));
            if (!direct) {
              KERNELS_RETURN_IF_ERROR(
                  be->CopyBlock(n, w, tmp, w, out(k) + b.slot * w, stride, false));
            }
          }
          if (node.type == NodeType::kLinear) {
            KERNELS_RETURN_IF_ERROR(
                be->AddBias(n, node.width, out(k), ctx.params[linear_bias_[k]], out(k)));
          }
          break;
        }
        case NodeType::kConcat: {
          int64_t offset = 0;
          for (int in : node.inputs) {
            const int64_t f = nodes[in].features();
            KERNELS_RETURN_IF_ERROR(
                be->CopyBlock(n, f, out(in), f, out(k) + offset, node.features(), false));
            offset += f;
          }
          break;
        }
        case NodeType::kMlp:
        case NodeType::kConv2d: {
          const Stack& m = stacks_[k];
          const float* in = out(node.inputs[0]);
          for (size_t j = 0; j < m.layers.size(); ++j) {
            KERNELS_RETURN_IF_ERROR(m.layers[j]->Forward(ctx, in, mlp_act(k, j), scratch(k, j)));
            in = mlp_act(k, j);
          }
          break;
        }
        case NodeType::kFm: {
          const GraphNode& in = nodes[node.inputs[0]];
          KERNELS_RETURN_IF_ERROR(
              be->FmForward(n, in.vectors, in.width, out(node.inputs[0]), out(k)));
          break;
        }
        case NodeType::kDotInteraction: {
          const GraphNode& in = nodes[node.inputs[0]];
          KERNELS_RETURN_IF_ERROR(
              be->DotInteractionForward(n, in.vectors, in.width, out(node.inputs[0]), out(k)));
          break;
        }
        case NodeType::kAdd: {
          const int64_t f = node.features();
          for (size_t j = 0; j < node.inputs.size(); ++j) {
            KERNELS_RETURN_IF_ERROR(
                be->CopyBlock(n, f, out(node.inputs[j]), f, out(k), f, j > 0));
          }
          break;
        }
      }
    }

    // ---- Loss: the head's gradient goes to its input's gradient. ----
    if (train) {
      for (size_t k = 0; k + 1 < count; ++k) {
        if (needs_grad(static_cast<int>(k))) {
          KERNELS_RETURN_IF_ERROR(
              be->Fill(n * nodes[k].features(), 0.0f, grad(static_cast<int>(k))));
        }
      }
      for (size_t i = 0; i < num_params; ++i) {
        if (params_[i].sparse) {
          KERNELS_RETURN_IF_ERROR(
              be->Fill(ctx.sparse_rows[i] * params_[i].row_width, 0.0f, ctx.grads[i]));
        }
      }
    }
    if (head.type == NodeType::kSigmoid) {
      KERNELS_RETURN_IF_ERROR(
          be->SigmoidCrossEntropy(n, logits, labels, grad_scale, dlogits, row_stats));
    } else {
      KERNELS_RETURN_IF_ERROR(be->SoftmaxCrossEntropy(n, num_classes_, logits, labels, grad_scale,
                                                      dlogits, row_stats));
    }

    // ---- Backward, in reverse: each node adds its inputs' gradients. ----
    for (size_t kk = count - 1; train && kk-- > 0;) {
      const int k = static_cast<int>(kk);
      const GraphNode& node = nodes[k];
      if (IsInput(node.type)) continue;
      const float* g = grad(k);
      switch (node.type) {
        case NodeType::kEmbedding:
        case NodeType::kLinear: {
          const int64_t stride = node.features();
          for (const Bags& b : bags_) {
            if (b.node != k) continue;
            const int64_t w = params_[b.param].row_width;
            const int64_t bags = static_cast<int64_t>(b.offsets.size()) - 1;
            const bool direct = b.slot < 0 || stride == w;
            if (!direct) {
              KERNELS_RETURN_IF_ERROR(be->CopyBlock(n, w, g + b.slot * w, stride, tmp, w, false));
            }
            KERNELS_RETURN_IF_ERROR(be->EmbeddingBagBackward(
                bags, w, static_cast<int64_t>(b.rows.size()), b.d_offsets, b.d_rows, b.d_weights,
                direct ? g : tmp, ctx.sparse_rows[b.param], ctx.grads[b.param]));
          }
          std::vector<int> done;
          for (const Bags& b : bags_) {
            if (b.node == k) done.push_back(b.param);
          }
          if (node.type == NodeType::kLinear) {
            KERNELS_RETURN_IF_ERROR(
                be->ColumnSum(n, node.width, g, false, ctx.grads[linear_bias_[k]]));
            done.push_back(linear_bias_[k]);
          }
          KERNELS_RETURN_IF_ERROR(grads_ready(std::move(done)));
          break;
        }
        case NodeType::kConcat: {
          int64_t offset = 0;
          for (int in : node.inputs) {
            const int64_t f = nodes[in].features();
            if (needs_grad(in)) {
              KERNELS_RETURN_IF_ERROR(
                  be->CopyBlock(n, f, g + offset, node.features(), grad(in), f, true));
            }
            offset += f;
          }
          break;
        }
        case NodeType::kMlp:
        case NodeType::kConv2d: {
          const Stack& m = stacks_[k];
          const int in_node = node.inputs[0];
          float* ping[2] = {reinterpret_cast<float*>(ws + mlp_grad_off[k]),
                            reinterpret_cast<float*>(ws + mlp_grad_off[k] + floats(m.max_width))};
          const float* dout = g;
          for (size_t j = m.layers.size(); j-- > 0;) {
            float* din = j > 0 ? ping[j % 2] : (needs_grad(in_node) ? tmp : nullptr);
            const float* in = j == 0 ? out(in_node) : mlp_act(k, j - 1);
            KERNELS_RETURN_IF_ERROR(
                m.layers[j]->Backward(ctx, in, mlp_act(k, j), dout, din, scratch(k, j)));
            KERNELS_RETURN_IF_ERROR(grads_ready(m.layers[j]->Params()));
            dout = din;
          }
          if (needs_grad(in_node)) {
            const int64_t f = nodes[in_node].features();
            KERNELS_RETURN_IF_ERROR(be->CopyBlock(n, f, tmp, f, grad(in_node), f, true));
          }
          break;
        }
        case NodeType::kFm:
        case NodeType::kDotInteraction: {
          const int in_node = node.inputs[0];
          if (!needs_grad(in_node)) break;
          const GraphNode& in = nodes[in_node];
          if (node.type == NodeType::kFm) {
            KERNELS_RETURN_IF_ERROR(be->FmBackward(n, in.vectors, in.width, out(in_node), g, tmp));
          } else {
            KERNELS_RETURN_IF_ERROR(
                be->DotInteractionBackward(n, in.vectors, in.width, out(in_node), g, tmp));
          }
          const int64_t f = in.features();
          KERNELS_RETURN_IF_ERROR(be->CopyBlock(n, f, tmp, f, grad(in_node), f, true));
          break;
        }
        case NodeType::kAdd: {
          const int64_t f = node.features();
          for (int in : node.inputs) {
            if (needs_grad(in)) {
              KERNELS_RETURN_IF_ERROR(be->CopyBlock(n, f, g, f, grad(in), f, true));
            }
          }
          break;
        }
        default:
          break;
      }
    }
    KERNELS_RETURN_IF_ERROR(
        be->ColumnSum(n, 2, row_stats, false, static_cast<float*>(io_.device(stats_slot))));
    if (scores != nullptr) {
      KERNELS_RETURN_IF_ERROR(backend_->CopyOnDevice(logits, io_.device(logits_slot),
                                                     sizeof(float) * n * logit_width));
    }
    return absl::OkStatus();
  };
  if (graphs_.enabled()) {
    // Everything the queued ops' arguments depend on: shapes and the loss's scale, and the
    // addresses of the workspace and of the step's device slots and parameters.
    uint32_t scale_bits = 0;
    std::memcpy(&scale_bits, &grad_scale, sizeof(scale_bits));
    std::vector<uint64_t> key = {train, scores != nullptr, static_cast<uint64_t>(n), scale_bits,
                                 reinterpret_cast<uintptr_t>(ws), bytes, took};
    io_.AppendLayoutKey(&key);
    if (took) prefetch_.AppendLayoutKey(&key);
    KERNELS_RETURN_IF_ERROR(graphs_.Run(std::move(key), enqueue));
  } else {
    KERNELS_RETURN_IF_ERROR(enqueue());
  }
  // The op stream is done with the prefetched parameters after these ops.
  if (took) KERNELS_RETURN_IF_ERROR(prefetch_.Release());
  if (async_grads) KERNELS_RETURN_IF_ERROR(QueueGradientCopies(ready, ctx.grads, *grads));
  step_.n = n;
  step_.logit_width = logit_width;
  step_.scores = scores;
  return absl::OkStatus();
}

absl::Status GraphModel::GrowGradEvents(size_t count) {
  while (grad_events_.size() < count) {
    KERNELS_ASSIGN_OR_RETURN(Event e, backend_->CreateEvent());
    grad_events_.push_back(std::move(e));
  }
  return absl::OkStatus();
}

absl::Status GraphModel::QueueGradientCopies(const std::vector<std::vector<int>>& ready,
                                             const std::vector<float*>& device,
                                             const Gradients& grads) {
  // Each gradient goes back after the last group that names it (a table written by several
  // nodes is complete only after the last); any left over after the step's ops.
  const size_t num_params = params_.size();
  std::vector<size_t> group(num_params, ready.size());
  bool rest = false;
  for (size_t g = 0; g < ready.size(); ++g) {
    for (int p : ready[g]) group[p] = g;
  }
  for (size_t p = 0; p < num_params; ++p) rest |= group[p] == ready.size();
  if (rest) {
    KERNELS_RETURN_IF_ERROR(GrowGradEvents(ready.size() + 1));
    KERNELS_RETURN_IF_ERROR(backend_->RecordEvent(Stream::kOps, grad_events_[ready.size()]));
  }
  for (size_t g = 0; g < ready.size() + (rest ? 1 : 0); ++g) {
    bool waited = false;
    for (size_t p = 0; p < num_params; ++p) {
      if (group[p] != g) continue;
      if (!waited) {
        KERNELS_RETURN_IF_ERROR(backend_->WaitEvent(Stream::kDownload, grad_events_[g]));
        waited = true;
      }
      KERNELS_RETURN_IF_ERROR(backend_->CopyToHostAsync(
          device[p], grads.values[p].data(), grads.values[p].size() * sizeof(float)));
    }
  }
  if (!grads_done_.valid()) {
    KERNELS_ASSIGN_OR_RETURN(grads_done_, backend_->CreateEvent());
  }
  return backend_->RecordEvent(Stream::kDownload, grads_done_);
}

}  // namespace pscluster::kernels
