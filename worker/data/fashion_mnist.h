// Fashion-MNIST from the IDX files of Debian's `dataset-fashion-mnist` package:
// {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz. Pixels are scaled to [0, 1] and then
// standardised with the training set's mean and standard deviation.
#ifndef PSCLUSTER_WORKER_DATA_FASHION_MNIST_H_
#define PSCLUSTER_WORKER_DATA_FASHION_MNIST_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace pscluster::data {

inline constexpr char kFashionMnistDefaultDir[] = "/usr/share/datasets/fashion-mnist";

struct FashionMnist {
  DenseDataset train;  // 60,000 x 784
  DenseDataset test;   // 10,000 x 784
};

// Loads both splits from `dir` (empty = kFashionMnistDefaultDir). Errors name the file and, when
// it is missing, the Debian package to install.
absl::StatusOr<FashionMnist> LoadFashionMnist(const std::string& dir);

// Reads one IDX file (gzip-compressed or plain). Exposed for tests.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::string data;  // Raw unsigned bytes.
};
absl::StatusOr<IdxArray> ReadIdx(const std::string& path);

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_FASHION_MNIST_H_
