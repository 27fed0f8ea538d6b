// The output lines of the entrypoint tasks a worker runs or ran (psctl logs): per job and rank,
// the latest attempt's lines in a bounded buffer (the oldest lines are dropped first), for the
// last few tasks.
//
// Thread model: thread-safe (one mutex); tasks append, RPC threads read.
#ifndef PSCLUSTER_WORKER_TASK_LOGS_H_
#define PSCLUSTER_WORKER_TASK_LOGS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/common.pb.h"

namespace pscluster::worker {

struct TaskLogLimits {
  size_t max_lines = 20000;         // Per task.
  size_t max_bytes = 8 << 20;       // Per task (text bytes).
  size_t max_tasks = 16;            // Tasks kept (finished ones go first).
  size_t max_line_bytes = 16 << 10; // A longer line is cut.
};

class TaskLogBook {
 public:
  explicit TaskLogBook(TaskLogLimits limits = {}) : limits_(limits) {}

  // A new attempt of (job, rank) starts: its earlier lines here go.
  void Begin(const std::string& job, uint32_t rank, uint32_t attempt);
  // One line of the task's stdout or stderr ("stdout", "stderr"); ignored unless that attempt
  // is the latest begun.
  void Append(const std::string& job, uint32_t rank, uint32_t attempt, const char* stream,
              std::string text);
  // The task ended with `exit_code` (-1: killed by a signal, or never started).
  void Finish(const std::string& job, uint32_t rank, uint32_t attempt, int exit_code);

  // The lines after request.after_seq (at most max_lines: 0 = 1000). NOT_FOUND when no lines of
  // (job, rank) are kept here.
  absl::StatusOr<v1::TaskLogsResponse> Read(const v1::TaskLogsRequest& request) const;

 private:
  struct Task {
    uint32_t attempt = 0;
    std::deque<v1::TaskLogLine> lines;
    size_t bytes = 0;
    bool finished = false;
    int exit_code = 0;
    uint64_t begun = 0;  // Order of Begin() calls (eviction).
  };
  using Key = std::pair<std::string, uint32_t>;

  const TaskLogLimits limits_;
  mutable absl::Mutex mu_;
  std::map<Key, Task> tasks_ ABSL_GUARDED_BY(mu_);
  // Sequence numbers grow across tasks, so that a reader following a rank whose attempt starts
  // again on this worker goes on from where it was.
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t begun_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_TASK_LOGS_H_
