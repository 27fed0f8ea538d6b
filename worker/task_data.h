// Loads the data set a job names (DatasetSpec) and fills the model sizes it implies.
#ifndef PSCLUSTER_WORKER_TASK_DATA_H_
#define PSCLUSTER_WORKER_TASK_DATA_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "worker/batcher.h"
#include "worker/data/dataset.h"

namespace pscluster::worker {

struct DataDirs {
  std::string fashion_mnist;   // Empty = the Debian package's directory.
  std::string spam_assassin;   // Empty = where deploy/install_deps.sh puts it.
};

struct TaskData {
  std::string description;     // "fashion_mnist (60000 train, 10000 test) from /usr/share/..."
  bool sparse = false;
  data::DenseDataset dense_train, dense_test;
  data::SparseDataset sparse_train, sparse_test;

  int64_t train_size() const { return sparse ? sparse_train.n : dense_train.n; }
  int64_t test_size() const { return sparse ? sparse_test.n : dense_test.n; }
  std::unique_ptr<Batcher> TrainBatcher() const;
  std::unique_ptr<Batcher> TestBatcher() const;
};

// Loads spec.dataset; the dataset's path (when set) overrides `dirs`. Errors name the field, the
// path and what to install.
absl::StatusOr<std::unique_ptr<TaskData>> LoadTaskData(const v1::JobSpec& spec,
                                                       const DataDirs& dirs);

// The model spec with input_dim and num_classes filled from the data when the job left them 0.
v1::ModelSpec CompleteModelSpec(const v1::ModelSpec& model, const TaskData& data,
                                const v1::DatasetSpec& dataset);

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_TASK_DATA_H_
