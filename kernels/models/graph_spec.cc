#include "kernels/models/graph_spec.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pscluster::kernels {
namespace {

constexpr int64_t kMaxEmbeddingWidth = 4096;
constexpr int64_t kMaxWidth = int64_t{1} << 20;

const std::map<std::string, NodeType>& Types() {
  static const auto* types = new std::map<std::string, NodeType>{
      {"dense_input", NodeType::kDenseInput},
      {"categorical_input", NodeType::kCategoricalInput},
      {"embedding", NodeType::kEmbedding},
      {"linear", NodeType::kLinear},
      {"concat", NodeType::kConcat},
      {"mlp", NodeType::kMlp},
      {"conv2d", NodeType::kConv2d},
      {"fm", NodeType::kFm},
      {"dot_interaction", NodeType::kDotInteraction},
      {"add", NodeType::kAdd},
      {"softmax", NodeType::kSoftmax},
      {"sigmoid", NodeType::kSigmoid},
  };
  return *types;
}

bool PlainName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// A field's name as part of a table name.
std::string TableSafe(const std::string& s) {
  std::string out = s.substr(0, 64);
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) c = '_';
  }
  return out.empty() ? "_" : out;
}

std::string Shape(const GraphNode& n) {
  auto dim = [](int64_t d) { return d < 0 ? std::string("?") : absl::StrCat(d); };
  return absl::StrCat("[batch, ", dim(n.vectors), ", ", dim(n.width), "]");
}

class Planner {
 public:
  Planner(const v1::ModelSpec& spec, bool data_known) : spec_(spec), known_(data_known) {}

  absl::StatusOr<GraphPlan> Run() {
    if (!known_) {
      if (spec_.input_fields_size() > 0) {
        return Error("model.input_fields", "is filled by the workers from the data; leave it out");
      }
      if (spec_.key_space() != 0) {
        return Error("model.key_space", "is filled by the workers from the data; leave it out");
      }
    }
    if (spec_.hidden_size() > 0) return Error("model.hidden", "does not apply to kind graph (use an mlp layer's widths)");
    if (spec_.embedding_dim() != 0) {
      return Error("model.embedding_dim", "does not apply to kind graph (use an embedding layer's width)");
    }
    if (spec_.conv_channels_size() > 0) return Error("model.conv_channels", "does not apply to kind graph");
    if (!spec_.activation().empty()) {
      return Error("model.activation", "does not apply to kind graph (set it on each mlp layer)");
    }
    const int count = spec_.layers_size();
    if (count < 2) {
      return Error("model.layers", "a graph needs at least an input layer and a head (softmax or sigmoid)");
    }
    for (int i = 0; i < count; ++i) {
      absl::Status s = Layer(i);
      if (!s.ok()) return s;
    }
    absl::Status s = Connected();
    if (!s.ok()) return s;
    return std::move(plan_);
  }

 private:
  static absl::Status Error(const std::string& path, const std::string& message) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
  }
  static std::string At(int i, const char* key) {
    return key[0] == '\0' ? absl::StrCat("model.layers[", i, "]")
                          : absl::StrCat("model.layers[", i, "].", key);
  }

  // Refuses the keys that do not apply to the layer's type.
  absl::Status OnlyKeys(int i, const v1::LayerSpec& l, NodeType t) {
    const std::string& type = l.type();
    auto refuse = [&](const char* key) {
      return Error(At(i, key), absl::StrCat("does not apply to a ", type, " layer"));
    };
    if (l.width() != 0 && t != NodeType::kEmbedding && t != NodeType::kLinear) return refuse("width");
    if (l.widths_size() > 0 && t != NodeType::kMlp) return refuse("widths");
    if (l.names_size() > 0 && t != NodeType::kMlp) return refuse("names");
    if (!l.activation().empty() && t != NodeType::kMlp && t != NodeType::kConv2d) {
      return refuse("activation");
    }
    if (l.channels() != 0 && t != NodeType::kConv2d) return refuse("channels");
    if (l.kernel() != 0 && t != NodeType::kConv2d) return refuse("kernel");
    if (l.pool() != 0 && t != NodeType::kConv2d) return refuse("pool");
    if (l.init_stddev() != 0 && t != NodeType::kEmbedding && t != NodeType::kLinear) {
      return refuse("init_stddev");
    }
    if (l.output_activation() && t != NodeType::kMlp) return refuse("output_activation");
    if (!l.table().empty() && t != NodeType::kEmbedding) return refuse("table");
    if (!l.combiner().empty() && t != NodeType::kEmbedding && t != NodeType::kLinear) {
      return refuse("combiner");
    }
    if (l.fields_size() > 0 && t != NodeType::kCategoricalInput) return refuse("fields");
    if (l.flatten() && t != NodeType::kEmbedding) return refuse("flatten");
    return absl::OkStatus();
  }

  absl::Status Inputs(int i, const v1::LayerSpec& l, GraphNode& node) {
    const NodeType t = node.type;
    const bool input = t == NodeType::kDenseInput || t == NodeType::kCategoricalInput;
    const bool many = t == NodeType::kConcat || t == NodeType::kAdd;
    if (input && l.inputs_size() > 0) {
      return Error(At(i, "inputs"), absl::StrCat("a ", l.type(), " layer reads the data, not other layers"));
    }
    if (!input && !many && l.inputs_size() != 1) {
      return Error(At(i, "inputs"), absl::StrCat("a ", l.type(), " layer reads exactly one layer (got ",
                                                 l.inputs_size(), ")"));
    }
    if (many && l.inputs_size() < 2) {
      return Error(At(i, "inputs"), absl::StrCat("a ", l.type(), " layer reads at least two layers"));
    }
    for (int j = 0; j < l.inputs_size(); ++j) {
      const std::string path = absl::StrCat(At(i, "inputs"), "[", j, "]");
      auto it = index_.find(l.inputs(j));
      if (it == index_.end()) {
        return Error(path, absl::StrCat("'", l.inputs(j), "' names no earlier layer",
                                        l.inputs(j) == l.name() ? " (a layer cannot read itself)" : ""));
      }
      if (std::find(node.inputs.begin(), node.inputs.end(), it->second) != node.inputs.end()) {
        return Error(path, absl::StrCat("'", l.inputs(j), "' is listed twice"));
      }
      const GraphNode& in = plan_.nodes[it->second];
      const bool reads_fields = t == NodeType::kEmbedding || t == NodeType::kLinear;
      if (reads_fields != (in.type == NodeType::kCategoricalInput)) {
        return Error(path, reads_fields
                               ? absl::StrCat("a ", l.type(), " layer reads a categorical_input, not '",
                                              in.name, "'")
                               : absl::StrCat("'", in.name, "' is a categorical_input: only embedding "
                                              "and linear layers read one"));
      }
      node.inputs.push_back(it->second);
    }
    return absl::OkStatus();
  }

  absl::Status Categorical(int i, const v1::LayerSpec& l, GraphNode& node) {
    node.vectors = -1;
    node.width = -1;
    for (int j = 0; j < l.fields_size(); ++j) {
      for (int k = 0; k < j; ++k) {
        if (l.fields(k) == l.fields(j)) {
          return Error(absl::StrCat(At(i, "fields"), "[", j, "]"),
                       absl::StrCat("field '", l.fields(j), "' is used twice"));
        }
      }
    }
    if (!known_) return absl::OkStatus();
    if (spec_.input_fields_size() == 0) {
      if (l.fields_size() > 0) {
        return Error(At(i, "fields"), "the data has no named fields (libsvm: one field of every key)");
      }
      node.multi_valued = true;
      node.vectors = 1;
      return absl::OkStatus();
    }
    if (l.fields_size() == 0) {
      for (int f = 0; f < spec_.input_fields_size(); ++f) node.fields.push_back(f);
    }
    for (int j = 0; j < l.fields_size(); ++j) {
      int found = -1;
      for (int f = 0; f < spec_.input_fields_size(); ++f) {
        if (spec_.input_fields(f).name() == l.fields(j)) found = f;
      }
      if (found < 0) {
        std::vector<std::string> names;
        for (const v1::InputField& f : spec_.input_fields()) names.push_back(f.name());
        return Error(absl::StrCat(At(i, "fields"), "[", j, "]"),
                     absl::StrCat("the data has no field '", l.fields(j), "' (it has ",
                                  absl::StrJoin(names, ", "), ")"));
      }
      node.fields.push_back(found);
    }
    node.vectors = static_cast<int64_t>(node.fields.size());
    return absl::OkStatus();
  }

  absl::Status Combiner(int i, const v1::LayerSpec& l, GraphNode& node) {
    if (!l.combiner().empty() && l.combiner() != "sum" && l.combiner() != "mean") {
      return Error(At(i, "combiner"), absl::StrCat("must be sum or mean (got '", l.combiner(), "')"));
    }
    node.mean = l.combiner() == "mean";
    return absl::OkStatus();
  }

  absl::Status Embedding(int i, const v1::LayerSpec& l, GraphNode& node) {
    if (l.width() < 1 || l.width() > kMaxEmbeddingWidth) {
      return Error(At(i, "width"), absl::StrCat("an embedding needs a width in [1, ", kMaxEmbeddingWidth,
                                                "] (got ", l.width(), ")"));
    }
    if (absl::Status s = Combiner(i, l, node); !s.ok()) return s;
    const GraphNode& in = plan_.nodes[node.inputs[0]];
    node.width = l.width();
    node.vectors = in.vectors;
    if (!l.table().empty()) {
      if (!PlainName(l.table())) {
        return Error(At(i, "table"), "must be 1-64 characters of A-Z a-z 0-9 _ -");
      }
      node.shared_table = true;
      auto it = shared_.find(l.table());
      if (it != shared_.end()) {
        const GraphTable& t = plan_.tables[it->second];
        if (t.width != node.width) {
          return Error(At(i, "width"), absl::StrCat("table '", l.table(), "' is ", t.width,
                                                    " wide in an earlier layer; a shared table has one width"));
        }
        node.tables.push_back(it->second);
      } else {
        shared_[l.table()] = static_cast<int>(plan_.tables.size());
        node.tables.push_back(static_cast<int>(plan_.tables.size()));
        plan_.tables.push_back(
            {l.table(), node.width, known_ ? spec_.key_space() : 0, false, l.init_stddev()});
      }
    } else if (known_) {
      if (in.multi_valued) {
        node.tables.push_back(static_cast<int>(plan_.tables.size()));
        plan_.tables.push_back(
            {l.name() + "/features", node.width, spec_.key_space(), false, l.init_stddev()});
      } else {
        for (int f : in.fields) {
          const v1::InputField& field = spec_.input_fields(f);
          node.tables.push_back(static_cast<int>(plan_.tables.size()));
          plan_.tables.push_back({absl::StrCat(l.name(), "/", TableSafe(field.name())), node.width,
                                  field.size(), false, l.init_stddev()});
        }
      }
    }
    if (l.flatten()) {
      node.width = node.features();
      node.vectors = 1;
    }
    return absl::OkStatus();
  }

  absl::Status Conv2d(int i, const v1::LayerSpec& l, const GraphNode& in, GraphNode& node) {
    if (in.type != NodeType::kDenseInput && in.type != NodeType::kConv2d) {
      return Error(
          At(i, "inputs"),
          absl::StrCat("a conv2d layer reads a dense_input or a conv2d, not '", in.name, "'"));
    }
    if (l.channels() < 1 || l.channels() > 4096) {
      return Error(At(i, "channels"),
                   absl::StrCat("a conv2d needs channels in [1, 4096] (got ", l.channels(), ")"));
    }
    const int64_t kernel = l.kernel() == 0 ? 5 : l.kernel();
    if (kernel % 2 == 0 || kernel > 15) {
      return Error(At(i, "kernel"), absl::StrCat("must be odd and at most 15 (got ", kernel, ")"));
    }
    const int64_t pool = l.pool() == 0 ? 2 : l.pool();
    if (pool > 16) return Error(At(i, "pool"), absl::StrCat("must be at most 16 (got ", pool, ")"));
    if (!l.activation().empty() && l.activation() != "relu" && l.activation() != "gelu") {
      return Error(At(i, "activation"),
                   absl::StrCat("must be relu or gelu (got '", l.activation(), "')"));
    }
    node.vectors = 1;
    node.width = -1;
    if (!known_) return absl::OkStatus();
    if (in.side == 0) {
      return Error(At(i, "inputs"), absl::StrCat("'", in.name, "' is not a square image (its ",
                                                 in.features(), " features are no side^2)"));
    }
    if (in.side % pool != 0) {
      return Error(At(i, "pool"),
                   absl::StrCat("the ", in.side, "x", in.side, " image of '", in.name,
                                "' does not divide into ", pool, "x", pool, " windows"));
    }
    node.side = in.side / pool;
    node.channels = l.channels();
    node.width = node.side * node.side * node.channels;
    return absl::OkStatus();
  }

  absl::Status Layer(int i) {
    const v1::LayerSpec& l = spec_.layers(i);
    if (!PlainName(l.name())) {
      return Error(At(i, "name"), l.name().empty() ? "is required"
                                                   : "must be 1-64 characters of A-Z a-z 0-9 _ -");
    }
    if (index_.contains(l.name())) {
      return Error(At(i, "name"), absl::StrCat("'", l.name(), "' is already the name of layer ",
                                               index_[l.name()]));
    }
    auto type = Types().find(l.type());
    if (type == Types().end()) {
      std::vector<std::string> names;
      for (const auto& [name, t] : Types()) names.push_back(name);
      return Error(At(i, "type"), l.type().empty()
                                      ? absl::StrCat("is required (", absl::StrJoin(names, ", "), ")")
                                      : absl::StrCat("unknown layer type '", l.type(), "' (not one of ",
                                                     absl::StrJoin(names, ", "), ")"));
    }
    GraphNode node;
    node.type = type->second;
    node.name = l.name();
    const bool last = i + 1 == spec_.layers_size();
    const bool head = node.type == NodeType::kSoftmax || node.type == NodeType::kSigmoid;
    if (head && !last) {
      return Error(At(i, "type"), "a head (softmax or sigmoid) must be the last layer");
    }
    if (last && !head) {
      return Error(At(i, "type"), "the last layer must be the head: softmax or sigmoid");
    }
    if (absl::Status s = OnlyKeys(i, l, node.type); !s.ok()) return s;
    if (!(std::isfinite(l.init_stddev()) && l.init_stddev() >= 0 && l.init_stddev() <= 10)) {
      return Error(At(i, "init_stddev"), "must be in [0, 10]");
    }
    if (absl::Status s = Inputs(i, l, node); !s.ok()) return s;
    auto input = [&](int j) -> const GraphNode& { return plan_.nodes[node.inputs[j]]; };
    switch (node.type) {
      case NodeType::kDenseInput:
        node.vectors = 1;
        node.width = known_ ? static_cast<int64_t>(spec_.input_dim()) : -1;
        if (known_ && node.width < 1) {
          return Error(At(i, "type"), "the data has no dense features for a dense_input");
        }
        if (known_) {
          const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(double(node.width))));
          if (side * side == node.width) {
            node.side = side;
            node.channels = 1;
          }
        }
        break;
      case NodeType::kCategoricalInput: {
        absl::Status s = Categorical(i, l, node);
        if (!s.ok()) return s;
        break;
      }
      case NodeType::kEmbedding: {
        absl::Status s = Embedding(i, l, node);
        if (!s.ok()) return s;
        break;
      }
      case NodeType::kLinear: {
        if (absl::Status s = Combiner(i, l, node); !s.ok()) return s;
        const int64_t w = l.width() == 0 ? 1 : l.width();
        if (w > kMaxEmbeddingWidth) {
          return Error(At(i, "width"), absl::StrCat("must be at most ", kMaxEmbeddingWidth));
        }
        node.vectors = 1;
        node.width = w;
        node.tables.push_back(static_cast<int>(plan_.tables.size()));
        plan_.tables.push_back(
            {l.name() + "/weight", w, known_ ? spec_.key_space() : 0, true, l.init_stddev()});
        break;
      }
      case NodeType::kConcat: {
        bool same = true, known = true;
        int64_t vectors = 0, features = 0;
        for (size_t j = 0; j < node.inputs.size(); ++j) {
          const GraphNode& in = input(j);
          if (in.width < 0) known = false;
          if (in.width != input(0).width) same = false;
          vectors = in.vectors < 0 || vectors < 0 ? -1 : vectors + in.vectors;
          features = in.features() < 0 || features < 0 ? -1 : features + in.features();
        }
        if (!known) {
          node.vectors = node.width = -1;
        } else if (same) {
          node.vectors = vectors;
          node.width = input(0).width;
        } else {
          node.vectors = 1;
          node.width = features;
        }
        break;
      }
      case NodeType::kMlp: {
        if (l.widths_size() == 0) return Error(At(i, "widths"), "an mlp needs at least one width");
        for (int j = 0; j < l.widths_size(); ++j) {
          if (l.widths(j) < 1 || l.widths(j) > kMaxWidth) {
            return Error(absl::StrCat(At(i, "widths"), "[", j, "]"),
                         absl::StrCat("must be in [1, ", kMaxWidth, "]"));
          }
        }
        if (!l.activation().empty() && l.activation() != "relu" && l.activation() != "gelu") {
          return Error(At(i, "activation"), absl::StrCat("must be relu or gelu (got '", l.activation(), "')"));
        }
        if (l.names_size() > 0 && l.names_size() != l.widths_size()) {
          return Error(At(i, "names"), absl::StrCat("gives ", l.names_size(), " names for ",
                                                    l.widths_size(), " widths (one each)"));
        }
        for (int j = 0; j < l.names_size(); ++j) {
          if (!PlainName(l.names(j))) {
            return Error(absl::StrCat(At(i, "names"), "[", j, "]"),
                         "must be 1-64 characters of A-Z a-z 0-9 _ -");
          }
        }
        if (known_ && input(0).features() < 1) {
          return Error(At(i, "inputs"), absl::StrCat("'", input(0).name, "' has no features"));
        }
        node.vectors = 1;
        node.width = l.widths(l.widths_size() - 1);
        break;
      }
      case NodeType::kConv2d: {
        absl::Status s = Conv2d(i, l, input(0), node);
        if (!s.ok()) return s;
        break;
      }
      case NodeType::kFm:
      case NodeType::kDotInteraction: {
        const GraphNode& in = input(0);
        if (in.vectors >= 0 && in.vectors < 2) {
          return Error(At(i, "inputs"),
                       absl::StrCat("'", in.name, "' is ", Shape(in), ": a ", l.type(),
                                    " layer needs two or more vectors of one width (concat "
                                    "embeddings and layers of the same width; no flatten)"));
        }
        node.vectors = 1;
        if (node.type == NodeType::kFm) {
          node.width = 1;
        } else {
          node.width = in.vectors < 0 ? -1 : in.vectors * (in.vectors - 1) / 2;
        }
        break;
      }
      case NodeType::kAdd: {
        for (size_t j = 1; j < node.inputs.size(); ++j) {
          if (input(j).features() >= 0 && input(0).features() >= 0 &&
              input(j).features() != input(0).features()) {
            return Error(absl::StrCat(At(i, "inputs"), "[", j, "]"),
                         absl::StrCat("widths do not match: '", input(j).name, "' has ",
                                      input(j).features(), " features, '", input(0).name, "' ",
                                      input(0).features()));
          }
        }
        node.vectors = input(0).vectors;
        node.width = input(0).width;
        for (size_t j = 1; j < node.inputs.size(); ++j) {
          if (input(j).vectors != node.vectors || input(j).width != node.width) {
            node.vectors = input(0).features() < 0 ? -1 : 1;
            node.width = input(0).features();
          }
        }
        break;
      }
      case NodeType::kSoftmax:
      case NodeType::kSigmoid: {
        const GraphNode& in = input(0);
        const bool sigmoid = node.type == NodeType::kSigmoid;
        if (sigmoid && spec_.num_classes() != 0 && spec_.num_classes() != 2) {
          return Error(At(i, "type"), absl::StrCat("a sigmoid head needs two classes (model.num_classes is ",
                                                   spec_.num_classes(), "; use softmax)"));
        }
        const int64_t want = sigmoid ? 1 : static_cast<int64_t>(spec_.num_classes());
        if (in.features() >= 0 && want > 0 && in.features() != want) {
          return Error(At(i, "inputs"),
                       absl::StrCat("widths do not match: the ", l.type(), " head takes ", want,
                                    sigmoid ? " logit" : " logits (model.num_classes)", ", '", in.name,
                                    "' has ", in.features(), " features"));
        }
        node.vectors = 1;
        node.width = 1;
        break;
      }
    }
    index_[l.name()] = i;
    plan_.nodes.push_back(std::move(node));
    return absl::OkStatus();
  }

  // Every layer leads to the head (the last layer).
  absl::Status Connected() {
    const int count = static_cast<int>(plan_.nodes.size());
    std::vector<bool> used(count, false);
    used[count - 1] = true;
    for (int i = count - 1; i >= 0; --i) {
      if (!used[i]) {
        return Error(At(i, ""), absl::StrCat("layer '", plan_.nodes[i].name, "' does not lead to the head '",
                                             plan_.nodes[count - 1].name, "' (the graph is not connected)"));
      }
      for (int in : plan_.nodes[i].inputs) used[in] = true;
    }
    return absl::OkStatus();
  }

  const v1::ModelSpec& spec_;
  const bool known_;
  GraphPlan plan_;
  absl::flat_hash_map<std::string, int> index_;
  absl::flat_hash_map<std::string, int> shared_;
};

}  // namespace

absl::StatusOr<GraphPlan> PlanGraph(const v1::ModelSpec& spec, bool data_known) {
  return Planner(spec, data_known).Run();
}

}  // namespace pscluster::kernels
