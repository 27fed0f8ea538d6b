#include "kernels/models/create_model.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/models/graph_model.h"
#include "kernels/status_macros.h"

namespace pscluster::kernels {
namespace {

constexpr int64_t kMaxWidth = int64_t{1} << 20;          // Any one layer width or class count.
constexpr int64_t kKernel = 5;                           // CNN convolutions: 5x5, padding 2.

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

absl::Status CheckWidth(const char* field, int64_t v) {
  if (v < 1 || v > kMaxWidth) {
    return Invalid(absl::StrCat("model.", field, " = ", v, " must be in [1, ", kMaxWidth, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckHidden(const v1::ModelSpec& spec) {
  for (int i = 0; i < spec.hidden_size(); ++i) {
    if (spec.hidden(i) < 1 || spec.hidden(i) > kMaxWidth) {
      return Invalid(absl::StrCat("model.hidden[", i, "] = ", spec.hidden(i), " must be in [1, ",
                                  kMaxWidth, "]"));
    }
  }
  return absl::OkStatus();
}

v1::LayerSpec* AddLayer(v1::ModelSpec* g, const std::string& name, const std::string& type,
                        std::vector<std::string> inputs = {}) {
  v1::LayerSpec* l = g->add_layers();
  l->set_name(name);
  l->set_type(type);
  for (std::string& in : inputs) l->add_inputs(std::move(in));
  return l;
}

// An mlp layer of `widths` whose tables are `names[i]/weight` and `/bias`.
void AddMlp(v1::ModelSpec* g, const std::string& input, const v1::ModelSpec& spec,
            const std::vector<std::pair<std::string, int64_t>>& layers) {
  v1::LayerSpec* mlp = AddLayer(g, "layers", "mlp", {input});
  for (const auto& [name, width] : layers) {
    mlp->add_widths(static_cast<uint32_t>(width));
    mlp->add_names(name);
  }
  mlp->set_activation(spec.activation());
}

// The hidden layers fc1..fcL of `spec.hidden`, then `out` of num_classes.
std::vector<std::pair<std::string, int64_t>> HiddenThenOut(const v1::ModelSpec& spec) {
  std::vector<std::pair<std::string, int64_t>> layers;
  for (int i = 0; i < spec.hidden_size(); ++i) {
    layers.emplace_back(absl::StrCat("fc", i + 1), spec.hidden(i));
  }
  layers.emplace_back("out", spec.num_classes());
  return layers;
}

absl::Status BuildSoftmax(const v1::ModelSpec& spec, v1::ModelSpec* g) {
  if (spec.hidden_size() > 0) return Invalid("model.hidden must be empty for kind 'softmax'");
  AddLayer(g, "input", "dense_input");
  AddMlp(g, "input", spec, {{"linear", spec.num_classes()}});
  return absl::OkStatus();
}

absl::Status BuildMlp(const v1::ModelSpec& spec, v1::ModelSpec* g) {
  if (spec.hidden_size() == 0) {
    return Invalid("model.hidden must list at least one layer width for kind 'mlp'");
  }
  AddLayer(g, "input", "dense_input");
  AddMlp(g, "input", spec, HiddenThenOut(spec));
  return absl::OkStatus();
}

absl::Status BuildCnn(const v1::ModelSpec& spec, v1::ModelSpec* g) {
  const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(double(spec.input_dim()))));
  if (side * side != spec.input_dim() || side % 4 != 0) {
    return Invalid(absl::StrCat("model.input_dim = ", spec.input_dim(),
                                " must be a square image side^2 with side a multiple of 4 for "
                                "kind 'cnn' (784 for 28x28)"));
  }
  std::vector<int64_t> channels = {16, 32};
  if (spec.conv_channels_size() > 0) {
    if (spec.conv_channels_size() != 2) {
      return Invalid(absl::StrCat("model.conv_channels must have 2 entries for kind 'cnn', has ",
                                  spec.conv_channels_size()));
    }
    for (int i = 0; i < 2; ++i) {
      if (spec.conv_channels(i) < 1 || spec.conv_channels(i) > 4096) {
        return Invalid(absl::StrCat("model.conv_channels[", i, "] = ", spec.conv_channels(i),
                                    " must be in [1, 4096]"));
      }
      channels[i] = spec.conv_channels(i);
    }
  }
  if (spec.hidden_size() > 1) {
    return Invalid("model.hidden must have at most one entry (the fc1 width) for kind 'cnn'");
  }
  const int64_t fc = spec.hidden_size() == 1 ? spec.hidden(0) : 128;
  AddLayer(g, "image", "dense_input");
  std::string in = "image";
  for (int i = 0; i < 2; ++i) {
    const std::string name = absl::StrCat("conv", i + 1);
    v1::LayerSpec* conv = AddLayer(g, name, "conv2d", {in});
    conv->set_channels(static_cast<uint32_t>(channels[i]));
    conv->set_kernel(kKernel);
    conv->set_pool(2);
    conv->set_activation(spec.activation());
    in = name;
  }
  AddMlp(g, in, spec, {{"fc1", fc}, {"out", spec.num_classes()}});
  return absl::OkStatus();
}

absl::Status BuildSparse(const v1::ModelSpec& spec, v1::ModelSpec* g) {
  // The keys are the model's input: input_dim (when > 0) bounds them.
  g->set_input_dim(0);
  g->set_key_space(spec.input_dim());
  AddLayer(g, "keys", "categorical_input");
  if (spec.embedding_dim() == 0) {
    if (spec.hidden_size() > 0) {
      return Invalid("model.hidden needs model.embedding_dim > 0 for kind 'sparse_linear'");
    }
    // A hashed linear model: sparse/weight (rows of num_classes, zeros) summed over the
    // example's weighted keys, + sparse/bias; its sum is the logits.
    AddLayer(g, "sparse", "linear", {"keys"})->set_width(spec.num_classes());
    return absl::OkStatus();
  }
  const int64_t e = spec.embedding_dim();
  KERNELS_RETURN_IF_ERROR(CheckWidth("embedding_dim", e));
  // The weighted sum of embedding/weight rows, + embedding/bias, into the head mlp.
  v1::LayerSpec* emb = AddLayer(g, "embedding", "linear", {"keys"});
  emb->set_width(static_cast<uint32_t>(e));
  emb->set_init_stddev(static_cast<float>(1.0 / std::sqrt(static_cast<double>(e))));
  AddMlp(g, "embedding", spec, HiddenThenOut(spec));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const v1::ModelSpec& spec, Backend* backend,
                                                   const ModelOptions& options) {
  if (backend == nullptr) return Invalid("CreateModel: backend is null");
  if (spec.kind() == "graph") {
    auto graph = GraphModel::Create(spec, backend, options.seed, "graph", options.conv_chunk_bytes,
                                    options.layer_gradient_copies);
    if (!graph.ok()) return graph.status();
    return std::unique_ptr<Model>(std::move(*graph));
  }
  if (spec.layers_size() > 0 || spec.input_fields_size() > 0 || spec.key_space() != 0) {
    return Invalid(absl::StrCat("model.layers applies only to kind 'graph', not '", spec.kind(), "'"));
  }
  if (!spec.activation().empty() && spec.activation() != "relu" && spec.activation() != "gelu") {
    return Invalid(absl::StrCat("model.activation '", spec.activation(),
                                "' is not one of relu, gelu"));
  }
  const std::string& kind = spec.kind();
  const bool sparse = kind == "sparse_linear";
  if (kind != "softmax" && kind != "mlp" && kind != "cnn" && !sparse) {
    return Invalid(absl::StrCat("model.kind '", kind,
                                "' is not one of softmax, mlp, cnn, sparse_linear, graph"));
  }
  if (spec.num_classes() < 2 || spec.num_classes() > kMaxWidth) {
    return Invalid(absl::StrCat("model.num_classes = ", spec.num_classes(), " must be in [2, ",
                                kMaxWidth, "]"));
  }
  if (!sparse) KERNELS_RETURN_IF_ERROR(CheckWidth("input_dim", spec.input_dim()));
  KERNELS_RETURN_IF_ERROR(CheckHidden(spec));
  if (kind != "cnn" && spec.conv_channels_size() > 0) {
    return Invalid(absl::StrCat("model.conv_channels applies only to kind 'cnn', not '", kind, "'"));
  }
  if (!sparse && spec.embedding_dim() > 0) {
    return Invalid(absl::StrCat("model.embedding_dim applies only to kind 'sparse_linear', not '",
                                kind, "'"));
  }

  // The preset's layers (create_model.h), built as any graph.
  v1::ModelSpec g;
  g.set_kind("graph");
  g.set_input_dim(spec.input_dim());
  g.set_num_classes(spec.num_classes());
  if (kind == "softmax") {
    KERNELS_RETURN_IF_ERROR(BuildSoftmax(spec, &g));
  } else if (kind == "mlp") {
    KERNELS_RETURN_IF_ERROR(BuildMlp(spec, &g));
  } else if (kind == "cnn") {
    KERNELS_RETURN_IF_ERROR(BuildCnn(spec, &g));
  } else {
    KERNELS_RETURN_IF_ERROR(BuildSparse(spec, &g));
  }
  const std::string logits = g.layers(g.layers_size() - 1).name();
  AddLayer(&g, "head", "softmax", {logits});
  auto model = GraphModel::Create(g, backend, options.seed, kind, options.conv_chunk_bytes,
                                  options.layer_gradient_copies);
  if (!model.ok()) return model.status();
  return std::unique_ptr<Model>(std::move(*model));
}

}  // namespace pscluster::kernels
