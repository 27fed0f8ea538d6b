// A task that runs the job's own command (JobSpec.entrypoint) as a child process: the task file
// and the environment of the contract (README, "Your own script"), its stdout and stderr line
// by line into the worker's log and the TaskLogBook (psctl logs), its progress lines
// (PSCLUSTER_PROGRESS_FD) into the task's progress reports, and its exit status into the task's
// outcome: 0 succeeded; 75 (EX_TEMPFAIL), or killed by a signal the worker did not send,
// retryable (UNAVAILABLE: the rank is handed over); any other status failed. Cancel() (StopTask,
// fencing, the worker stopping) sends the process group SIGTERM, then SIGKILL after the grace.
//
// Thread model: Run() on the task thread (it spawns, reads and waits for the child); Cancel,
// UpdateShardMap and Snapshot from any thread.
#ifndef PSCLUSTER_WORKER_ENTRYPOINT_RUNNER_H_
#define PSCLUSTER_WORKER_ENTRYPOINT_RUNNER_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker.pb.h"
#include "worker/task_logs.h"
#include "worker/task_runner.h"

namespace pscluster::worker {

// Exit status of a command that asks to be run again (BSD sysexits' EX_TEMPFAIL).
inline constexpr int kEntrypointRetryExit = 75;

struct EntrypointOptions {
  bool allow = false;            // ps_worker --allow_entrypoints.
  std::string scheduler;         // PSCLUSTER_SCHEDULER.
  // The worker's own credentials, passed on (PSCLUSTER_TLS_*, PSCLUSTER_TOKEN_FILE); "" = none.
  std::string tls_ca, tls_cert, tls_key, credential_file;
  absl::Duration stop_grace = absl::Seconds(10);  // SIGTERM to SIGKILL.
  std::string temp_root;         // Parent of the per-task private directories ("" = $TMPDIR or /tmp).
  TaskLogBook* logs = nullptr;   // Where the output lines are kept (may be null).
};

// A progress line (JSON, EntrypointProgress); INVALID_ARGUMENT says what is wrong with it.
absl::StatusOr<v1::EntrypointProgress> ParseProgressLine(absl::string_view line);

class EntrypointRunner final : public TaskRunner {
 public:
  // FAILED_PRECONDITION unless options.allow. REQUIRES: task.spec() has an entrypoint; `sink`
  // outlives the runner.
  static absl::StatusOr<std::unique_ptr<EntrypointRunner>> Create(
      const v1::AssignTaskRequest& task, EntrypointOptions options, ProgressSink* sink);
  ~EntrypointRunner() override;

  absl::Status Run() override;
  void Cancel(absl::string_view reason) override;
  void UpdateShardMap(const v1::ShardMap& map) override;
  TaskSnapshot Snapshot() const override;

 private:
  EntrypointRunner(const v1::AssignTaskRequest& task, EntrypointOptions options,
                   ProgressSink* sink);
  absl::Status RunChild(const std::string& task_file);
  // A complete line of the child's stdout (0), stderr (1) or progress pipe (2).
  void OnLine(int stream, std::string line);
  void OnProgress(const std::string& line);

  const v1::AssignTaskRequest task_;
  const EntrypointOptions options_;
  ProgressSink* const sink_;
  int wake_[2] = {-1, -1};  // Cancel() writes a byte; Run() polls the read end.

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::string cancel_reason_ ABSL_GUARDED_BY(mu_);
  TaskSnapshot snapshot_ ABSL_GUARDED_BY(mu_);

  // Task thread only.
  v1::WorkerProgress progress_;
  uint64_t rate_examples_ = 0;
  absl::Time rate_start_ = absl::InfinitePast();
  std::string last_stderr_;  // The child's last stderr lines, for the failure's message.
  int bad_progress_lines_ = 0;
  bool child_ran_ = false;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_ENTRYPOINT_RUNNER_H_
