// Training and test sources over the user's files (a job whose dataset names a `format`),
// streamed: a rank never holds more than its reader's window and prefetch queue
// (data/stream_reader.h), whatever the data's size.
//
// Each epoch is one pass over the rank's part (data/streaming_dataset.h), in the epoch's own
// seeded order. A part with fewer examples than the epoch's steps read starts over within the
// epoch (the same order again); one with more leaves the rest unread in that epoch. A task that
// starts mid-epoch (a hand-over, a restore) skips the examples of the steps already done.
//
// Thread model: the task thread only (the readers run their own threads).
#ifndef PSCLUSTER_WORKER_STREAMED_DATA_H_
#define PSCLUSTER_WORKER_STREAMED_DATA_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "worker/data/example.h"
#include "worker/data/file_system.h"
#include "worker/data/streaming_dataset.h"
#include "worker/training_data.h"

namespace pscluster::worker {

// A job's streamed data set, opened: its files listed, its schema read.
struct StreamedData {
  std::unique_ptr<data::FileSystem> fs;
  std::unique_ptr<data::StreamingDataset> dataset;
  // Lines with data in the whole training split (the schedule's size), counted at open.
  int64_t train_lines = 0;

  // "libsvm: 3 files, 1.2 GB at /data/train/*.gz; test held out (20%); 581012 training lines".
  std::string Describe() const;
};

// Opens spec.dataset (REQUIRES data::IsStreamed) and counts the training split's lines (a read
// without parsing). Errors name the key ("dataset.train: /data/x: no such file or directory").
absl::StatusOr<std::unique_ptr<StreamedData>> OpenStreamedData(const v1::JobSpec& spec);

// The model spec with input_dim and num_classes filled from the schema when the job left them
// 0: the dense features for a dense model, the key space for sparse_linear.
v1::ModelSpec CompleteStreamedModelSpec(const v1::ModelSpec& model, const data::Schema& schema);

// Views an ExampleBatch as a model's batch (valid while `b` is unchanged).
kernels::Batch AsBatch(const data::ExampleBatch& b);

class StreamedTrainSource final : public TrainSource {
 public:
  // Counts the part's lines. INVALID_ARGUMENT names the field when `part` does not fit the data,
  // FAILED_PRECONDITION when the part holds no examples. REQUIRES: data outlives the source.
  static absl::StatusOr<std::unique_ptr<StreamedTrainSource>> Create(
      const StreamedData* data, const data::PartitionSpec& part, uint32_t job_batch,
      int64_t steps_per_epoch);

  int64_t examples() const override { return examples_; }
  int64_t batch() const override { return batch_; }
  absl::StatusOr<kernels::Batch> BatchFor(int64_t n) override;
  absl::StatusOr<std::string> Repartition(const data::PartitionSpec& next) override;

  // Bytes and lines of every pass so far, the current one included.
  DataStats stats() const override;

 private:
  StreamedTrainSource(const StreamedData* data, data::PartitionSpec part, uint32_t job_batch,
                      int64_t steps_per_epoch)
      : data_(data), part_(std::move(part)), job_batch_(job_batch),
        steps_per_epoch_(steps_per_epoch) {}

  // Starts a pass of `epoch` over the part, skipping `skip` examples.
  absl::Status StartPass(int64_t epoch, uint64_t skip);

  const StreamedData* const data_;
  data::PartitionSpec part_;
  const uint32_t job_batch_;
  const int64_t steps_per_epoch_;
  int64_t examples_ = 0;
  int64_t batch_ = 0;
  // A part to read from the next epoch on (shares changed, or the reader had passed its last
  // chunk when ranks' parts were added).
  std::optional<data::PartitionSpec> pending_;

  data::ReadRequest request_;
  std::unique_ptr<data::StreamReader> reader_;
  DataStats finished_;  // Of the passes before the current reader's.
  int64_t reader_epoch_ = -1;
  int64_t next_step_ = -1;  // The step BatchFor expects next; -1 before the first.
  // Batches alternate, so that step n's stays valid while n + 1's is made.
  data::ExampleBatch batches_[2];
  data::ExampleBatch scratch_;
};

class StreamedTestSource final : public TestSource {
 public:
  // REQUIRES: data outlives the source, data->dataset->has_test().
  explicit StreamedTestSource(const StreamedData* data) : data_(data) {}
  absl::Status Start() override;
  absl::StatusOr<kernels::Batch> Next(int64_t max_examples) override;

 private:
  const StreamedData* const data_;
  std::unique_ptr<data::StreamReader> reader_;
  data::ExampleBatch batch_;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_STREAMED_DATA_H_
