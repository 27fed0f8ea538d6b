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

// Parameter values (and gradient buffers) with owned storage for a model and a key set.
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
