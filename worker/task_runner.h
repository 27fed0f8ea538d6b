// The interface between the worker daemon's control plane (WorkerNode) and a training task.
#ifndef PSCLUSTER_WORKER_TASK_RUNNER_H_
#define PSCLUSTER_WORKER_TASK_RUNNER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/scheduler.pb.h"
#include "proto/worker.pb.h"

namespace pscluster::worker {

// Where a running task sends its progress and asks for a fresh shard map. Implemented by the
// daemon (forwarding to the scheduler) and by tests and standalone runs.
class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  // Returns false when the task should stop (the job was cancelled or failed elsewhere).
  virtual bool Report(const v1::WorkerProgress& progress) = 0;
  // A newer shard map after a server refused a stale epoch; UNAVAILABLE when none can be had.
  virtual absl::StatusOr<v1::ShardMap> RefreshShardMap() = 0;
};

struct TaskSnapshot {
  int64_t step = 0;
  double samples_per_sec = 0;
  double pull_wait_sec = 0;
  double compute_sec = 0;
  double push_sec = 0;
  uint64_t shard_map_epoch = 0;
  uint64_t data_bytes_read = 0;     // The user's files, whole task.
  uint64_t data_lines_skipped = 0;  // Malformed lines skipped (dataset.on_error: skip).
};

class TaskRunner {
 public:
  virtual ~TaskRunner() = default;
  // Runs the whole task on the calling thread; returns OK when every epoch is done, CANCELLED
  // after Cancel(), or the error that stopped it. Reports progress to the sink as it goes.
  virtual absl::Status Run() = 0;
  // Asks Run() to return soon (at the next step boundary or blocked call). Thread-safe.
  virtual void Cancel(absl::string_view reason) = 0;
  // A newer shard map pushed by the scheduler. Thread-safe.
  virtual void UpdateShardMap(const v1::ShardMap& map) = 0;
  // The task's data partition, lead rank and count of training ranks change (a rank left the
  // job and this task reads its part from now on, or came back); INVALID_ARGUMENT, changing nothing, when the partition does not fit
  // the task. Thread-safe.
  virtual absl::Status UpdatePartition(const v1::UpdatePartitionRequest& update) {
    return absl::UnimplementedError("this task cannot change its data partition");
  }
  // Thread-safe.
  virtual TaskSnapshot Snapshot() const = 0;
  // An export of the model as the servers hold it now (psctl export), to run on another thread:
  // self-contained, so it may outlive the task. FAILED_PRECONDITION before the task's tables
  // exist. Thread-safe.
  using ExportFn = std::function<absl::StatusOr<v1::ExportModelResponse>()>;
  virtual absl::StatusOr<ExportFn> PrepareExport(const std::string& path) {
    return absl::UnimplementedError("this task cannot export its model on demand");
  }
};

// Builds the runner for an assigned task. REQUIRES: `sink` outlives the runner.
using TaskRunnerFactory = std::function<absl::StatusOr<std::unique_ptr<TaskRunner>>(
    const v1::AssignTaskRequest& task, ProgressSink* sink)>;

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_TASK_RUNNER_H_
