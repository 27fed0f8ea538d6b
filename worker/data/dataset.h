// In-memory training data as the worker feeds it to a model: dense examples (images) or sparse
// examples (hashed bag-of-words), with integer class labels.
#ifndef PSCLUSTER_WORKER_DATA_DATASET_H_
#define PSCLUSTER_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

namespace pscluster::data {

// n examples of `dim` float features each, row-major.
struct DenseDataset {
  int64_t n = 0;
  int64_t dim = 0;
  int num_classes = 0;
  std::vector<float> x;     // n * dim
  std::vector<int32_t> y;   // n, each in [0, num_classes)
};

// n examples in CSR form: example i has features keys[offsets[i] .. offsets[i+1]) with values.
struct SparseDataset {
  int64_t n = 0;
  int num_classes = 0;
  uint64_t key_space = 0;          // Every key is < key_space.
  std::vector<uint64_t> offsets;   // n + 1, offsets[0] == 0
  std::vector<uint64_t> keys;
  std::vector<float> values;
  std::vector<int32_t> y;          // n
};

struct TrainTest {
  std::string description;  // Where it came from, for logs ("fashion-mnist at /usr/share/...").
};

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_DATASET_H_
