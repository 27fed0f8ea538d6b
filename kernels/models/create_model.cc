#include "kernels/models/create_model.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/models/graph_model.h"
#include "kernels/models/sequential_model.h"
#include "kernels/status_macros.h"

namespace pscluster::kernels {
namespace {

using v1::InitializerSpec;

constexpr int64_t kMaxWidth = int64_t{1} << 20;         // Any one layer width or class count.
constexpr int64_t kMaxParamElements = int64_t{1} << 31;  // Per dense table.
constexpr int64_t kKernel = 5;                           // CNN convolutions: 5x5, padding 2.

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

// Collects parameters and layers while a model is being described.
class Builder {
 public:
  Builder(const ModelOptions& options, Activation activation)
      : options_(options), activation_(activation) {}

  ModelConfig& config() { return config_; }
  Activation activation() const { return activation_; }

  int Dense(const std::string& name, std::vector<int64_t> shape, InitializerSpec::Kind rule,
            int64_t fan_in, int64_t fan_out) {
    ParamInfo p;
    p.name = name;
    p.shape = std::move(shape);
    p.init_rule = rule;
    p.fan_in = fan_in;
    p.fan_out = fan_out;
    p.init.set_seed(options_.seed);
    switch (rule) {
      case InitializerSpec::GLOROT_UNIFORM: {
        const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
        p.init.set_kind(InitializerSpec::UNIFORM);
        p.init.set_low(static_cast<float>(-limit));
        p.init.set_high(static_cast<float>(limit));
        break;
      }
      case InitializerSpec::HE_NORMAL:
        p.init.set_kind(InitializerSpec::NORMAL);
        p.init.set_mean(0.0f);
        p.init.set_stddev(static_cast<float>(std::sqrt(2.0 / static_cast<double>(fan_in))));
        break;
      default:
        p.init.set_kind(InitializerSpec::ZEROS);
        break;
    }
    config_.params.push_back(std::move(p));
    return static_cast<int>(config_.params.size()) - 1;
  }

  int Bias(const std::string& name, int64_t width) {
    return Dense(name, {width}, InitializerSpec::ZEROS, 0, 0);
  }

  int Sparse(const std::string& name, int64_t width, uint64_t key_space, float stddev) {
    ParamInfo p;
    p.name = name;
    p.sparse = true;
    p.row_width = width;
    p.key_space = key_space;
    p.init.set_seed(options_.seed);
    if (stddev > 0) {
      p.init_rule = InitializerSpec::NORMAL;
      p.init.set_kind(InitializerSpec::NORMAL);
      p.init.set_mean(0.0f);
      p.init.set_stddev(stddev);
    } else {
      p.init_rule = InitializerSpec::ZEROS;
      p.init.set_kind(InitializerSpec::ZEROS);
    }
    config_.params.push_back(std::move(p));
    return static_cast<int>(config_.params.size()) - 1;
  }

  // A fully connected layer `name` (weight + bias); hidden layers get He initialisation and the
  // activation, the output layer Glorot.
  void FullyConnected(const std::string& name, int64_t in, int64_t out, bool hidden) {
    const int w = Dense(name + "/weight", {in, out},
                        hidden ? InitializerSpec::HE_NORMAL : InitializerSpec::GLOROT_UNIFORM, in,
                        out);
    const int b = Bias(name + "/bias", out);
    config_.layers.push_back(MakeDenseLayer(in, out, w, b));
    if (hidden) config_.layers.push_back(MakeActivationLayer(out, activation_));
  }

  const ModelOptions& options() const { return options_; }

 private:
  const ModelOptions options_;
  const Activation activation_;
  ModelConfig config_;
};

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

absl::Status BuildSoftmax(const v1::ModelSpec& spec, Builder* b) {
  if (spec.hidden_size() > 0) return Invalid("model.hidden must be empty for kind 'softmax'");
  b->FullyConnected("linear", spec.input_dim(), spec.num_classes(), /*hidden=*/false);
  return absl::OkStatus();
}

absl::Status BuildMlp(const v1::ModelSpec& spec, Builder* b) {
  if (spec.hidden_size() == 0) {
    return Invalid("model.hidden must list at least one layer width for kind 'mlp'");
  }
  int64_t in = spec.input_dim();
  for (int i = 0; i < spec.hidden_size(); ++i) {
    b->FullyConnected(absl::StrCat("fc", i + 1), in, spec.hidden(i), /*hidden=*/true);
    in = spec.hidden(i);
  }
  b->FullyConnected("out", in, spec.num_classes(), /*hidden=*/false);
  return absl::OkStatus();
}

absl::Status BuildCnn(const v1::ModelSpec& spec, Backend* backend, Builder* b) {
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
  size_t chunk = b->options().conv_chunk_bytes;
  if (chunk == 0) chunk = backend->kind() == DeviceKind::kCpu ? size_t{4} << 20 : size_t{256} << 20;

  int64_t h = side, in_c = 1;
  for (int i = 0; i < 2; ++i) {
    const std::string name = absl::StrCat("conv", i + 1);
    const int64_t out_c = channels[i];
    const int w = b->Dense(name + "/weight", {out_c, kKernel, kKernel, in_c},
                           InitializerSpec::HE_NORMAL, kKernel * kKernel * in_c,
                           kKernel * kKernel * out_c);
    const int bias = b->Bias(name + "/bias", out_c);
    ModelConfig& c = b->config();
    c.layers.push_back(MakeConvLayer(h, h, in_c, out_c, kKernel, kKernel / 2, w, bias, chunk));
    c.layers.push_back(MakeActivationLayer(h * h * out_c, b->activation()));
    c.layers.push_back(MakeMaxPoolLayer(h, h, out_c, 2));
    h /= 2;
    in_c = out_c;
  }
  b->FullyConnected("fc1", h * h * in_c, fc, /*hidden=*/true);
  b->FullyConnected("out", fc, spec.num_classes(), /*hidden=*/false);
  return absl::OkStatus();
}

absl::Status BuildSparse(const v1::ModelSpec& spec, Builder* b) {
  const int64_t classes = spec.num_classes();
  const uint64_t key_space = spec.input_dim();
  ModelConfig& c = b->config();
  c.input_kind = InputKind::kSparse;
  c.input_dim = 0;
  if (spec.embedding_dim() == 0) {
    if (spec.hidden_size() > 0) {
      return Invalid("model.hidden needs model.embedding_dim > 0 for kind 'sparse_linear'");
    }
    const int table = b->Sparse("sparse/weight", classes, key_space, 0.0f);
    const int bias = b->Bias("sparse/bias", classes);
    c.layers.push_back(MakeEmbeddingBagLayer(classes, table, bias));
    return absl::OkStatus();
  }
  const int64_t e = spec.embedding_dim();
  KERNELS_RETURN_IF_ERROR(CheckWidth("embedding_dim", e));
  const int table = b->Sparse("embedding/weight", e, key_space,
                              static_cast<float>(1.0 / std::sqrt(static_cast<double>(e))));
  const int bias = b->Bias("embedding/bias", e);
  c.layers.push_back(MakeEmbeddingBagLayer(e, table, bias));
  int64_t in = e;
  for (int i = 0; i < spec.hidden_size(); ++i) {
    b->FullyConnected(absl::StrCat("fc", i + 1), in, spec.hidden(i), /*hidden=*/true);
    in = spec.hidden(i);
  }
  b->FullyConnected("out", in, classes, /*hidden=*/false);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const v1::ModelSpec& spec, Backend* backend,
                                                   const ModelOptions& options) {
  if (backend == nullptr) return Invalid("CreateModel: backend is null");
  if (spec.kind() == "graph") {
    auto graph = GraphModel::Create(spec, backend, options.seed);
    if (!graph.ok()) return graph.status();
    return std::unique_ptr<Model>(std::move(*graph));
  }
  if (spec.layers_size() > 0 || spec.input_fields_size() > 0 || spec.key_space() != 0) {
    return Invalid(absl::StrCat("model.layers applies only to kind 'graph', not '", spec.kind(), "'"));
  }
  Activation activation;
  if (spec.activation().empty() || spec.activation() == "relu") {
    activation = Activation::kRelu;
  } else if (spec.activation() == "gelu") {
    activation = Activation::kGelu;
  } else {
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

  Builder b(options, activation);
  b.config().kind = kind;
  b.config().input_dim = spec.input_dim();
  b.config().num_classes = spec.num_classes();
  if (kind == "softmax") {
    KERNELS_RETURN_IF_ERROR(BuildSoftmax(spec, &b));
  } else if (kind == "mlp") {
    KERNELS_RETURN_IF_ERROR(BuildMlp(spec, &b));
  } else if (kind == "cnn") {
    KERNELS_RETURN_IF_ERROR(BuildCnn(spec, backend, &b));
  } else {
    KERNELS_RETURN_IF_ERROR(BuildSparse(spec, &b));
  }
  for (const ParamInfo& p : b.config().params) {
    if (!p.sparse && p.num_elements() >= kMaxParamElements) {
      return Invalid(absl::StrCat("parameter ", p.name, " would have ", p.num_elements(),
                                  " elements; at most 2^31 - 1 per table"));
    }
  }
  return std::unique_ptr<Model>(new SequentialModel(backend, std::move(b.config())));
}

}  // namespace pscluster::kernels
