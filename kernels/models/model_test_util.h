// Test helpers: model specs, random batches and parameter sets with owned storage.
#ifndef PSCLUSTER_KERNELS_MODELS_MODEL_TEST_UTIL_H_
#define PSCLUSTER_KERNELS_MODELS_MODEL_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "kernels/models/model.h"
#include "proto/job.pb.h"

namespace pscluster::kernels::testing {

inline v1::ModelSpec Spec(const std::string& kind, uint32_t input_dim, uint32_t classes,
                          std::vector<uint32_t> hidden = {}, const std::string& activation = "",
                          uint32_t embedding_dim = 0, std::vector<uint32_t> conv = {}) {
  v1::ModelSpec s;
  s.set_kind(kind);
  s.set_input_dim(input_dim);
  s.set_num_classes(classes);
  for (uint32_t h : hidden) s.add_hidden(h);
  s.set_activation(activation);
  s.set_embedding_dim(embedding_dim);
  for (uint32_t c : conv) s.add_conv_channels(c);
  return s;
}

// A batch with its own storage.
struct OwnedBatch {
  std::vector<float> dense;
  std::vector<uint64_t> offsets, keys;
  std::vector<float> values;
  std::vector<int32_t> labels;
  Batch view() const {
    Batch b;
    b.num_examples = static_cast<int64_t>(labels.size());
    b.dense = dense;
    b.offsets = offsets;
    b.keys = keys;
    b.values = values;
    b.labels = labels;
    return b;
  }
};

inline OwnedBatch RandomDenseBatch(std::mt19937_64& rng, int64_t n, int64_t dim, int classes) {
  OwnedBatch b;
  std::normal_distribution<float> normal;
  b.dense.resize(n * dim);
  for (float& x : b.dense) x = normal(rng);
  std::uniform_int_distribution<int32_t> label(0, classes - 1);
  for (int64_t i = 0; i < n; ++i) b.labels.push_back(label(rng));
  return b;
}

// Up to max_features features per example from keys [0, key_space), with repeats.
inline OwnedBatch RandomSparseBatch(std::mt19937_64& rng, int64_t n, uint64_t key_space,
                                    int max_features, int classes) {
  OwnedBatch b;
  std::uniform_int_distribution<int> len(1, max_features);
  std::uniform_int_distribution<uint64_t> key(0, key_space - 1);
  std::uniform_real_distribution<float> value(0.1f, 1.0f);
  std::uniform_int_distribution<int32_t> label(0, classes - 1);
  b.offsets.push_back(0);
  for (int64_t i = 0; i < n; ++i) {
    const int l = len(rng);
    for (int j = 0; j < l; ++j) {
      b.keys.push_back(key(rng));
      b.values.push_back(value(rng));
    }
    b.offsets.push_back(b.keys.size());
    b.labels.push_back(label(rng));
  }
  return b;
}

// A layer appended to a `graph` model spec.
inline v1::LayerSpec* AddLayer(v1::ModelSpec* s, const std::string& name, const std::string& type,
                               std::vector<std::string> inputs = {}) {
  v1::LayerSpec* l = s->add_layers();
  l->set_name(name);
  l->set_type(type);
  for (const std::string& in : inputs) l->add_inputs(in);
  return l;
}

// The data's shape in a graph spec, as a worker fills it: `dense` dense features and `fields`
// categorical fields of `field_size` keys each, laid out one after another (none: libsvm-like
// keys below key_space).
inline void SetGraphData(v1::ModelSpec* s, uint32_t dense, int fields, uint64_t field_size,
                         uint64_t key_space) {
  s->set_kind("graph");
  s->set_input_dim(dense);
  for (int f = 0; f < fields; ++f) {
    v1::InputField* field = s->add_input_fields();
    field->set_name("C" + std::to_string(f + 1));
    field->set_base(f * field_size);
    field->set_size(field_size);
  }
  s->set_key_space(fields > 0 ? fields * field_size : key_space);
}

// Examples with `dense` dense features and one key per field (fields of field_size keys, laid
// out as SetGraphData does), weight 1.
inline OwnedBatch RandomFieldBatch(std::mt19937_64& rng, int64_t n, int64_t dense, int fields,
                                   uint64_t field_size, int classes) {
  OwnedBatch b;
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<uint64_t> key(0, field_size - 1);
  std::uniform_int_distribution<int32_t> label(0, classes - 1);
  b.offsets.push_back(0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < dense; ++j) b.dense.push_back(normal(rng));
    for (int f = 0; f < fields; ++f) {
      b.keys.push_back(f * field_size + key(rng));
      b.values.push_back(1.0f);
    }
    b.offsets.push_back(b.keys.size());
    b.labels.push_back(label(rng));
  }
  return b;
}

// Graphs of the shapes users build (`activation` for every mlp: gelu keeps them smooth).
// Logistic regression over libsvm-like keys.
inline v1::ModelSpec LrGraph(uint64_t key_space) {
  v1::ModelSpec s;
  SetGraphData(&s, 0, 0, 0, key_space);
  s.set_num_classes(2);
  AddLayer(&s, "keys", "categorical_input");
  AddLayer(&s, "wide", "linear", {"keys"});
  AddLayer(&s, "head", "sigmoid", {"wide"});
  return s;
}

// Two conv2d layers over a side x side image (3x3 kernels; the first without pooling, the second
// with 2x2), then an mlp with named tables, over `classes` classes.
inline v1::ModelSpec ConvGraph(uint32_t side, uint32_t classes, const std::string& activation) {
  v1::ModelSpec s;
  SetGraphData(&s, side * side, 0, 0, 0);
  s.set_num_classes(classes);
  AddLayer(&s, "image", "dense_input");
  v1::LayerSpec* a = AddLayer(&s, "a", "conv2d", {"image"});
  a->set_channels(2);
  a->set_kernel(3);
  a->set_pool(1);
  a->set_activation(activation);
  v1::LayerSpec* b = AddLayer(&s, "b", "conv2d", {"a"});
  b->set_channels(3);
  b->set_kernel(3);
  b->set_activation(activation);
  v1::LayerSpec* top = AddLayer(&s, "top", "mlp", {"b"});
  top->add_widths(5);
  top->add_widths(classes);
  top->add_names("hidden");
  top->add_names("logits");
  top->set_activation(activation);
  AddLayer(&s, "head", "softmax", {"top"});
  return s;
}

// A factorization machine: linear + pairwise term over per-field embeddings.
inline v1::ModelSpec FmGraph(int fields, uint64_t field_size, uint32_t width) {
  v1::ModelSpec s;
  SetGraphData(&s, 0, fields, field_size, 0);
  s.set_num_classes(2);
  AddLayer(&s, "cat", "categorical_input");
  AddLayer(&s, "wide", "linear", {"cat"});
  AddLayer(&s, "emb", "embedding", {"cat"})->set_width(width);
  AddLayer(&s, "pairs", "fm", {"emb"});
  AddLayer(&s, "logit", "add", {"wide", "pairs"});
  AddLayer(&s, "head", "sigmoid", {"logit"});
  return s;
}

// Wide & deep: a linear part over the fields plus an mlp over the dense features and the
// flattened embeddings (one shared table).
inline v1::ModelSpec WideDeepGraph(uint32_t dense, int fields, uint64_t field_size,
                                   uint32_t width, const std::string& activation) {
  v1::ModelSpec s;
  SetGraphData(&s, dense, fields, field_size, 0);
  s.set_num_classes(2);
  AddLayer(&s, "dense", "dense_input");
  AddLayer(&s, "cat", "categorical_input");
  AddLayer(&s, "wide", "linear", {"cat"});
  v1::LayerSpec* e = AddLayer(&s, "emb", "embedding", {"cat"});
  e->set_width(width);
  e->set_table("shared");
  e->set_flatten(true);
  AddLayer(&s, "deep_in", "concat", {"dense", "emb"});
  v1::LayerSpec* m = AddLayer(&s, "deep", "mlp", {"deep_in"});
  m->add_widths(8);
  m->add_widths(1);
  m->set_activation(activation);
  AddLayer(&s, "logit", "add", {"wide", "deep"});
  AddLayer(&s, "head", "sigmoid", {"logit"});
  return s;
}

// DLRM: a bottom mlp over the dense features, per-field embeddings of the same width, their
// pairwise dot products, and a top mlp over the bottom output and the products.
inline v1::ModelSpec DlrmGraph(uint32_t dense, int fields, uint64_t field_size, uint32_t width,
                               const std::string& activation) {
  v1::ModelSpec s;
  SetGraphData(&s, dense, fields, field_size, 0);
  s.set_num_classes(2);
  AddLayer(&s, "dense", "dense_input");
  AddLayer(&s, "cat", "categorical_input");
  v1::LayerSpec* b = AddLayer(&s, "bottom", "mlp", {"dense"});
  b->add_widths(6);
  b->add_widths(width);
  b->set_activation(activation);
  b->set_output_activation(true);
  AddLayer(&s, "emb", "embedding", {"cat"})->set_width(width);
  AddLayer(&s, "vectors", "concat", {"bottom", "emb"});
  AddLayer(&s, "dots", "dot_interaction", {"vectors"});
  AddLayer(&s, "top_in", "concat", {"bottom", "dots"});
  v1::LayerSpec* t = AddLayer(&s, "top", "mlp", {"top_in"});
  t->add_widths(6);
  t->add_widths(1);
  t->set_activation(activation);
  AddLayer(&s, "head", "sigmoid", {"top"});
  return s;
}

// A softmax head over a mean-combined bag of libsvm-like keys.
inline v1::ModelSpec BagSoftmaxGraph(uint64_t key_space, int classes) {
  v1::ModelSpec s;
  SetGraphData(&s, 0, 0, 0, key_space);
  s.set_num_classes(classes);
  AddLayer(&s, "keys", "categorical_input");
  v1::LayerSpec* e = AddLayer(&s, "emb", "embedding", {"keys"});
  e->set_width(5);
  e->set_combiner("mean");
  v1::LayerSpec* m = AddLayer(&s, "out", "mlp", {"emb"});
  m->add_widths(classes);
  AddLayer(&s, "head", "softmax", {"out"});
  return s;
}

// Parameter values (and gradient buffers) with owned storage for a model and a key set.
// A model a step test runs, with the shape of its batches: `dense` features, `fields`
// categorical fields of `field_size` keys each (graph models), `classes`; a sparse model's rows
// draw `nnz` keys of `key_space`.
struct ModelCase {
  v1::ModelSpec spec;
  int dense = 0, fields = 0, classes = 2;
  uint64_t field_size = 0;
  uint64_t key_space = 0;
  int nnz = 0;
};

// A random batch of `n` rows for `c`.
inline OwnedBatch BatchFor(const ModelCase& c, std::mt19937_64& rng, int64_t n) {
  return c.fields > 0   ? RandomFieldBatch(rng, n, c.dense, c.fields, c.field_size, 2)
         : c.dense > 0 ? RandomDenseBatch(rng, n, c.dense, c.classes)
                       : RandomSparseBatch(rng, n, c.key_space, c.nnz, c.classes);
}

// The device tests' models at Fashion-MNIST and Criteo-like sizes: an MLP with hidden layers
// `mlp_hidden`, a CNN, wide & deep over 26 fields, a sparse linear model.
inline std::vector<ModelCase> DeviceModelCases(const std::vector<uint32_t>& mlp_hidden) {
  return {
      {Spec("mlp", 784, 10, mlp_hidden, "relu"), 784, 0, 10},
      {Spec("cnn", 784, 10, {64}, "relu", 0, {8, 16}), 784, 0, 10},
      {WideDeepGraph(13, 26, 1000, 8, "relu"), 13, 26, 2, 1000},
      {Spec("sparse_linear", 0, 2, {32}, "gelu", 16), 0, 0, 2, 0, 5000, 40},
  };
}

struct OwnedParams {
  std::vector<std::vector<float>> values;
  std::vector<std::vector<uint64_t>> keys;
  std::vector<std::vector<float>> grads;

  OwnedParams(const Model& model, std::vector<std::vector<uint64_t>> step_keys,
              std::mt19937_64& rng, float scale) : keys(std::move(step_keys)) {
    std::normal_distribution<float> normal(0.0f, scale);
    for (size_t i = 0; i < model.params().size(); ++i) {
      const ParamInfo& p = model.params()[i];
      const size_t n = p.sparse ? keys[i].size() * p.row_width : p.num_elements();
      values.emplace_back(n);
      for (float& v : values.back()) v = normal(rng);
      grads.emplace_back(n, 0.0f);
    }
  }
  ParamValues view() const {
    ParamValues v;
    for (size_t i = 0; i < values.size(); ++i) {
      v.values.push_back(values[i]);
      v.keys.push_back(keys[i]);
    }
    return v;
  }
  Gradients grad_view() {
    Gradients g;
    for (auto& x : grads) g.values.push_back(absl::MakeSpan(x));
    return g;
  }
};

}  // namespace pscluster::kernels::testing

#endif  // PSCLUSTER_KERNELS_MODELS_MODEL_TEST_UTIL_H_
