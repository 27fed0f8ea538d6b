// Training and test sources over a data set held in memory (TaskData: Fashion-MNIST,
// SpamAssassin). A rank's part is a list of example ids in the job's permutation
// (data::PartitionExamples); each epoch reads it in its own seeded order.
#ifndef PSCLUSTER_WORKER_IN_MEMORY_DATA_H_
#define PSCLUSTER_WORKER_IN_MEMORY_DATA_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/batcher.h"
#include "worker/task_data.h"
#include "worker/training_data.h"

namespace pscluster::worker {

class InMemoryTrainSource final : public TrainSource {
 public:
  // INVALID_ARGUMENT names the field when `part` does not fit the data.
  // REQUIRES: data outlives the source.
  static absl::StatusOr<std::unique_ptr<InMemoryTrainSource>> Create(
      const TaskData* data, uint64_t seed, const data::PartitionSpec& part, uint32_t job_batch,
      int64_t steps_per_epoch);

  int64_t examples() const override { return static_cast<int64_t>(partition_.size()); }
  int64_t batch() const override { return batch_; }
  absl::StatusOr<kernels::Batch> BatchFor(int64_t n) override;
  absl::StatusOr<std::string> Repartition(const data::PartitionSpec& next) override;

 private:
  InMemoryTrainSource(const TaskData* data, uint64_t seed, data::PartitionSpec part,
                      uint32_t job_batch, int64_t steps_per_epoch)
      : data_(data),
        seed_(seed),
        part_(std::move(part)),
        job_batch_(job_batch),
        steps_per_epoch_(steps_per_epoch),
        batchers_{data->TrainBatcher(), data->TrainBatcher()} {}

  const TaskData* const data_;
  const uint64_t seed_;
  const data::PartitionSpec part_;
  const uint32_t job_batch_;
  const int64_t steps_per_epoch_;
  std::vector<int64_t> partition_;
  int64_t batch_ = 0;
  // Batches alternate between two batchers, so that step n's stays valid while n + 1's is made.
  std::unique_ptr<Batcher> batchers_[2];
  std::vector<int64_t> orders_[2];  // Epoch orders, by epoch parity.
  int64_t order_epoch_[2] = {-1, -1};
  std::vector<int64_t> ids_;
};

class InMemoryTestSource final : public TestSource {
 public:
  // REQUIRES: data outlives the source.
  explicit InMemoryTestSource(const TaskData* data) : data_(data), batcher_(data->TestBatcher()) {}
  absl::Status Start() override;
  absl::StatusOr<kernels::Batch> Next(int64_t max_examples) override;

 private:
  const TaskData* const data_;
  std::unique_ptr<Batcher> batcher_;
  int64_t next_ = 0;
  std::vector<int64_t> ids_;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_IN_MEMORY_DATA_H_
