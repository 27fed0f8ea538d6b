// What a training task reads: the batches of its part of the training set, step by step, and
// the test set it evaluates on. The built-in data sets are held in memory (in_memory_data.h);
// the user's files are streamed (streamed_data.h).
//
// Every rank of a job runs the same number of steps per epoch (Schedule): the BSP barrier never
// waits for a rank that has already finished its epoch. A rank whose part holds fewer examples
// than its steps read wraps around within the epoch; one with more leaves the rest for the next
// epoch's order.
//
// Thread model: the task thread only.
#ifndef PSCLUSTER_WORKER_TRAINING_DATA_H_
#define PSCLUSTER_WORKER_TRAINING_DATA_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/models/model.h"
#include "proto/worker.pb.h"
#include "worker/data/partition.h"

namespace pscluster::worker {

// A rank's part as the scheduler sent it (DataPartition), with the task's rank and worker count
// filling what it leaves out.
data::PartitionSpec PartitionSpecOf(const v1::DataPartition& p, uint32_t rank,
                                    uint32_t num_workers);

// The job's schedule: steps per epoch as for equal parts of the job's batch.
struct Schedule {
  int64_t steps_per_epoch = 1;
  int64_t total_steps = 1;
};
// `train_size` examples in all, cut into `parts` parts, `batch` examples per part and step.
Schedule ScheduleFor(int64_t train_size, uint32_t parts, uint32_t batch, uint32_t epochs);

// The examples per step of a rank reading `part` (`examples` in all): its parts' share of the
// job's examples per step, never more than it holds, nor less than the job's batch when that
// is larger.
int64_t RankBatch(const data::PartitionSpec& part, uint32_t job_batch, int64_t examples);

// What reading the data has cost so far (the user's files; zeros for a set held in memory).
struct DataStats {
  uint64_t bytes_read = 0;     // File bytes (compressed for gzip), whole task.
  uint64_t lines = 0;          // Lines with data offered to the parser.
  uint64_t skipped_lines = 0;  // Malformed lines skipped (dataset.on_error: skip).
};

class TrainSource {
 public:
  virtual ~TrainSource() = default;
  virtual DataStats stats() const { return DataStats(); }
  // Examples of this rank's part, and how many it reads per step.
  virtual int64_t examples() const = 0;
  virtual int64_t batch() const = 0;
  // The batch of step n (epoch n / steps_per_epoch). Steps come in order, each once, from the
  // task's start step; the batch stays valid until BatchFor(n + 2).
  virtual absl::StatusOr<kernels::Batch> BatchFor(int64_t n) = 0;
  // Reads `next` (the parts of ranks that left added, or new data shares) from the next batch
  // on. An error says why it cannot, and the current part stays; OK returns what it reads now
  // ("now reads 30000 examples (part 1 and 1 more of 2), 64 per step").
  virtual absl::StatusOr<std::string> Repartition(const data::PartitionSpec& next) = 0;
};

class TestSource {
 public:
  virtual ~TestSource() = default;
  // Starts a pass over the test set from its first example.
  virtual absl::Status Start() = 0;
  // The next at most `max_examples` examples; a batch of none at the end. Valid until the next
  // call.
  virtual absl::StatusOr<kernels::Batch> Next(int64_t max_examples) = 0;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_TRAINING_DATA_H_
