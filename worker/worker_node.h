// The worker daemon's control plane: registers with the scheduler and heartbeats under its
// lease, accepts one training task at a time (AssignTask), stops it (StopTask), forwards shard
// maps, reports progress, and answers Status.
//
// Thread model: gRPC callback threads call the handler methods (AssignTask, StopTask,
// UpdateShardMap, Status), which only take `mu_` briefly and never block. One heartbeat thread
// (Start/Shutdown) talks to the scheduler. Each task runs on its own thread owned by the node;
// the task talks to the scheduler through the node's ProgressSink. The node owns the runner and
// the threads; the SchedulerClient (may be null: standalone) outlives the node.
#ifndef PSCLUSTER_WORKER_WORKER_NODE_H_
#define PSCLUSTER_WORKER_WORKER_NODE_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/node_agent.h"
#include "proto/worker.pb.h"
#include "worker/scheduler_client.h"
#include "worker/task_runner.h"

namespace pscluster::worker {

struct WorkerNodeOptions {
  std::string address;               // host:port of this worker's WorkerControl service.
  v1::Resources capacity;            // Offered to the scheduler.
  std::string device;                // Backend description for Status ("cpu (2 threads)").
  // Give up (the on_fatal callback) if the scheduler cannot be reached for this long at start.
  absl::Duration registration_timeout = absl::Seconds(60);
  // Used until the scheduler suggests an interval.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Minimum spacing of progress reports (the final report is always sent).
  absl::Duration report_interval = absl::Milliseconds(500);
  // Advertised at registration: the scheduler places entrypoint jobs only on such workers.
  bool allow_entrypoints = false;
};

class WorkerNode : public ProgressSink {
 public:
  // `scheduler` may be null (standalone: no registration, progress only logged).
  WorkerNode(WorkerNodeOptions options, SchedulerClient* scheduler, TaskRunnerFactory factory);
  ~WorkerNode() override;

  // The host:port the scheduler calls this worker at, known once its server listens.
  // REQUIRES: called before Start().
  void SetAddress(const std::string& address);

  // Starts registration and heartbeats (common/node_agent.h: backoff on UNAVAILABLE and
  // DEADLINE_EXCEEDED). `on_fatal` is called (once, from the agent's thread) when the scheduler
  // stayed unreachable for registration_timeout at start, or refused the registration.
  void Start(std::function<void(absl::Status)> on_fatal);
  // Stops the task (if any) and the heartbeat thread; deregisters. Idempotent.
  void Shutdown();

  // Handlers (gRPC adapters call these).
  absl::Status AssignTask(const v1::AssignTaskRequest& request);
  absl::Status StopTask(const v1::StopTaskRequest& request);
  absl::StatusOr<uint64_t> UpdateShardMap(const v1::WorkerShardMapRequest& request);
  // Changes the running task's data partition (NOT_FOUND unless that job, rank and attempt run).
  absl::Status UpdatePartition(const v1::UpdatePartitionRequest& request);
  // psctl export: the export the named task (job, rank, attempt) would run, to run off the RPC
  // thread; NOT_FOUND unless that task runs here.
  absl::StatusOr<TaskRunner::ExportFn> PrepareExport(const v1::ExportModelRequest& request);
  v1::WorkerStatus Status() const;

  std::string node_id() const;
  // Blocks until the current task (if any) has finished or `timeout` passes; true if idle.
  bool WaitIdle(absl::Duration timeout);

  // ProgressSink (called by the task thread).
  bool Report(const v1::WorkerProgress& progress) override;
  absl::StatusOr<v1::ShardMap> RefreshShardMap() override;

 private:
  // The membership calls the agent makes.
  absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(const std::string& node_id);
  absl::Status Heartbeat(const std::string& node_id);
  void RunTask(TaskRunner* runner, std::string job_id, uint32_t rank, uint32_t attempt);
  void JoinFinishedTaskLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerNodeOptions options_;
  SchedulerClient* const scheduler_;
  const TaskRunnerFactory factory_;

  mutable absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  // The task's run has returned; its thread is only sending the final report (busy_ until then).
  bool task_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  uint32_t rank_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t attempt_ ABSL_GUARDED_BY(mu_) = 0;  // AssignTaskRequest.attempt of the task.
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<TaskRunner> runner_ ABSL_GUARDED_BY(mu_);
  std::thread task_thread_ ABSL_GUARDED_BY(mu_);
  absl::Time last_report_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  v1::WorkerProgress pending_progress_ ABSL_GUARDED_BY(mu_);

  // Registration and heartbeats (null without a scheduler). Last: its thread calls the members
  // above, and it is stopped (Shutdown) before they go.
  std::unique_ptr<NodeAgent> agent_;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_WORKER_NODE_H_
