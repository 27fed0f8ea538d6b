// One parsed example, a block of them in the layout a model's batch uses, and the schema that
// says what their features are.
#ifndef PSCLUSTER_WORKER_DATA_EXAMPLE_H_
#define PSCLUSTER_WORKER_DATA_EXAMPLE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pscluster::data {

// A categorical field's keys: [base, base + size). Key `base` stands for a missing value.
struct FieldInfo {
  std::string name;
  uint64_t base = 0;
  uint64_t size = 0;
};

struct Schema {
  uint32_t num_classes = 2;
  std::vector<std::string> dense;  // Names of the dense features, in order.
  // Categorical fields (csv, tsv, criteo): every example has exactly one key per field, in this
  // order, with value 1. Empty for libsvm, whose examples hold any number of keys.
  std::vector<FieldInfo> fields;
  uint64_t key_space = 0;  // Every key is below it; 0 = unbounded (libsvm without num_features).
};

// An example. Reused across lines: Clear keeps the vectors' capacity.
struct Example {
  int32_t label = 0;         // In [0, num_classes).
  std::vector<float> dense;  // schema.dense.size() values.
  std::vector<uint64_t> keys;
  std::vector<float> values;  // One per key.

  void Clear() {
    label = 0;
    dense.clear();
    keys.clear();
    values.clear();
  }
};

// Examples in the layout of kernels::Batch: dense row-major, sparse features in CSR.
struct ExampleBatch {
  uint32_t dense_dim = 0;
  std::vector<int32_t> labels;
  std::vector<float> dense;             // size() * dense_dim
  std::vector<uint64_t> offsets = {0};  // size() + 1
  std::vector<uint64_t> keys;
  std::vector<float> values;

  size_t size() const { return labels.size(); }
  void Clear();
  // REQUIRES: e.dense.size() == dense_dim.
  void Append(const Example& e);
  // Appends example `i` of `from`. REQUIRES: i < from.size(), the same dense_dim.
  void AppendFrom(const ExampleBatch& from, size_t i);
};

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_EXAMPLE_H_
