#include "worker/data/example.h"

namespace pscluster::data {

void ExampleBatch::Clear() {
  labels.clear();
  dense.clear();
  offsets.assign(1, 0);
  keys.clear();
  values.clear();
}

void ExampleBatch::Append(const Example& e) {
  labels.push_back(e.label);
  dense.insert(dense.end(), e.dense.begin(), e.dense.end());
  keys.insert(keys.end(), e.keys.begin(), e.keys.end());
  values.insert(values.end(), e.values.begin(), e.values.end());
  offsets.push_back(keys.size());
}

void ExampleBatch::AppendFrom(const ExampleBatch& from, size_t i) {
  labels.push_back(from.labels[i]);
  const size_t d = dense_dim;
  dense.insert(dense.end(), from.dense.begin() + i * d, from.dense.begin() + (i + 1) * d);
  const uint64_t b = from.offsets[i], e = from.offsets[i + 1];
  keys.insert(keys.end(), from.keys.begin() + b, from.keys.begin() + e);
  values.insert(values.end(), from.values.begin() + b, from.values.begin() + e);
  offsets.push_back(keys.size());
}

}  // namespace pscluster::data
