// The scheduler's logic behind the Scheduler gRPC service: node registry, job queue and
// lifecycle, placement, shard maps, progress and cluster status, all persisted in its Store
// (SQLite, or etcd for several schedulers).
//
// The Scheduler owns a SchedulerCore (scheduler_core.h: the job table, the cleanup queue, the
// registry and the steps of a job's life), answers the RPCs over it, and runs the passes
// (passes.h: each an object in a file of its own that sees only the core) in their order.
//
// Thread model:
//  * RPC handlers (the methods named like the RPCs) run on gRPC's callback threads. They touch
//    memory and the Store (short transactions) under the core's lock; only CheckpointJob,
//    ExportJob (job_data_rpcs.cc) and GetTaskLogs (task_logs_rpc.cc) call another daemon, the
//    job's servers or worker, outside it. Node RPCs are in node_rpcs.cc, job RPCs in
//    scheduler.cc, the elastic ones (scale, drain) in elastic.cc, MoveShard in shard_move.cc.
//  * Start() launches three threads (scheduler_loop.cc), each running its passes; they make
//    every other outgoing call, outside the lock. DefinePasses fixes the passes' order and
//    times each run into pscluster_scheduler_pass_seconds{pass=...}:
//    - the control loop (Loop, or RunOnce() driven by a test), every `tick` or when woken:
//      leases, verify_tasks, hand_over, drop_unreachable_backups, replace_backups, recover,
//      place, rejoin, balance_data, cleanups, persist_progress;
//    - the poll loop (PollLoop), every status_poll_interval / 2: poll_servers;
//    - the moves loop (MoveLoop, or RunMoves() in tests): moves (the rebalancer's look, the
//      elastic changes' steps, the queued shard moves one at a time: a move's copy may take
//      long; placement does not wait).
//  * Lock order: the core's mu(), then the registry's, then the store's.
// Ownership: the scheduler owns its core; the Store, Clock, ClusterRpc and PlacementPolicy are
// owned by the caller and must outlive it.
//
// A node that dies (lease expired), leaves or restarts while it holds a running job's shards or
// tasks starts a recovery (design section 4). A lost worker's rank is handed over: the control
// loop asks every server for the rank's clock and assigns the rank to an idle live worker, which
// resumes at the slowest of those clocks; the servers keep their state and their exactly-once
// tags drop whatever part of that step the lost worker had pushed. When that cannot be done (no
// idle worker, a server that does not answer) and for a lost server, the job goes RECOVERING:
// the loop stops its tasks and drops it on its servers, rolls it back to its newest complete
// checkpoint (every virtual shard covered by files of one step; none: from the start) and queues
// it; the next placement, on live nodes, has the servers restore those files and the workers
// resume at that step. After `max_recoveries` of either (or with 0) the job fails instead,
// naming the node. After a restart the loop also asks the workers of running jobs, once, whether
// they still run their tasks, and hands over the ranks of those that do not.
#ifndef PSCLUSTER_SCHEDULER_SCHEDULER_H_
#define PSCLUSTER_SCHEDULER_SCHEDULER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "proto/scheduler.pb.h"
#include "scheduler/cluster_rpc.h"
#include "scheduler/node_registry.h"
#include "scheduler/passes.h"
#include "scheduler/placement.h"
#include "scheduler/quotas.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/store.h"

namespace pscluster::scheduler {

class Scheduler {
 public:
  // Restores jobs and nodes from `store`. Jobs caught in placement are placed again (same shard
  // map); running jobs carry on.
  // REQUIRES: store, clock, rpc and placement outlive the scheduler.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerOptions& options,
                                                           Store* store, const Clock* clock,
                                                           ClusterRpc* rpc,
                                                           const PlacementPolicy* placement);
  // A read-only view of what `store` holds, for a follower's reads (ha_scheduler.h): jobs, shard
  // maps and nodes as last written, restored quietly; never Start()ed and never written through
  // (the caller serves only GetJob, ListJobs and GetShardMap from it).
  // REQUIRES: store and clock outlive the view.
  static absl::StatusOr<std::unique_ptr<Scheduler>> CreateView(const SchedulerOptions& options,
                                                               Store* store, const Clock* clock);
  ~Scheduler();

  // Starts / stops the three threads (control, poll and moves loops; Stop() is idempotent and
  // called by the destructor).
  void Start();
  void Stop();
  // One pass of the control loop and one of the poll loop, synchronously (tests drive this
  // with a FakeClock).
  void RunOnce();
  // Replaces the quotas (nullptr: none); submissions after the call are checked against them.
  void SetQuotas(std::shared_ptr<const Quotas> quotas) { core_.SetQuotas(std::move(quotas)); }

  // RPC handlers; errors are the exact gRPC codes documented in proto/scheduler.proto.
  absl::Status RegisterNode(const v1::RegisterNodeRequest& req, v1::RegisterNodeResponse* resp);
  absl::Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp);
  absl::Status Deregister(const v1::DeregisterRequest& req);
  absl::Status SubmitJob(const v1::SubmitJobRequest& req, v1::SubmitJobResponse* resp);
  // `owner`: the caller's identity (common/authz.h; "" when the scheduler authenticates no
  // one), recorded with the job and checked against its quota: RESOURCE_EXHAUSTED naming the
  // quota, its line in --quota_file, and what the identity holds.
  absl::Status SubmitJob(const v1::SubmitJobRequest& req, v1::SubmitJobResponse* resp,
                         const std::string& owner);
  absl::Status GetJob(const v1::GetJobRequest& req, v1::Job* resp);
  absl::Status ListJobs(const v1::ListJobsRequest& req, v1::ListJobsResponse* resp);
  absl::Status CancelJob(const v1::CancelJobRequest& req, v1::CancelJobResponse* resp);
  absl::Status GetShardMap(const v1::GetShardMapRequest& req, v1::ShardMap* resp);
  absl::Status ReportProgress(const v1::ReportProgressRequest& req,
                              v1::ReportProgressResponse* resp);
  absl::Status ClusterStatus(const v1::ClusterStatusRequest& req, v1::ClusterStatusResponse* resp);
  absl::Status MoveShard(const v1::MoveShardRequest& req, v1::MoveShardResponse* resp);
  // Unlike the other handlers, calls the job's servers (outside the lock): an operator's
  // on-demand checkpoint.
  absl::Status CheckpointJob(const v1::CheckpointJobRequest& req, v1::CheckpointJobResponse* resp);
  // Also calls out (the job's lead worker, outside the lock): an operator's on-demand export.
  absl::Status ExportJob(const v1::ExportJobRequest& req, v1::ExportJobResponse* resp);
  // psctl logs: the rank's output lines, from the worker that runs (or last ran) it
  // (scheduler/task_logs_rpc.cc).
  absl::Status GetTaskLogs(const v1::TaskLogsRequest& req, v1::TaskLogsResponse* resp);

  // Elastic servers (elastic.cc): a running job's set of servers grows or shrinks, a server is
  // drained of every job's shards; both carried out by live moves on the moves thread.
  absl::Status ScaleJob(const v1::ScaleJobRequest& req, v1::ScaleJobResponse* resp);
  absl::Status DrainServer(const v1::DrainServerRequest& req, v1::DrainServerResponse* resp);
  absl::Status UndrainServer(const v1::UndrainServerRequest& req, v1::UndrainServerResponse* resp);

  // Carries out the queued shard moves (and, when due, the rebalancer's look), one after the
  // other; the moves thread calls it (tests call it directly).
  void RunMoves();

  // The scheduler's metrics (nodes by role and state, jobs by state, running jobs' progress,
  // call counters, pass times), for a MetricsHttpServer; RenderMetrics() is their Prometheus
  // text. Thread-safe.
  const MetricsRegistry& metrics() const { return core_.metrics(); }
  // For the daemon's own families (its RPC latencies).
  MetricsRegistry* mutable_metrics() { return &core_.metrics(); }
  std::string RenderMetrics() const { return core_.metrics().Render(); }

  const NodeRegistry& registry() const { return core_.registry(); }

  // The store's state. A write that failed is a sticky error (leveldb's bg_error_): from then
  // on the scheduler publishes nothing (the control loop and the moves stop; SubmitJob,
  // CancelJob, MoveShard, RegisterNode and Deregister answer UNAVAILABLE naming the store) and
  // the control loop tries, every store_retry, to write to it again. Once that succeeds it
  // carries on from what the store holds, as after a restart (tasks verified, placements
  // redone); what the failed write held was never published. OK while the store works.
  // Thread-safe.
  absl::Status store_status() const { return core_.store_status(); }
  // Called with false when the store fails and true once it works again (the daemon sets gRPC
  // health to NOT_SERVING and back). REQUIRES: set before Start(); must not call back into the
  // scheduler.
  void OnServingChanged(std::function<void(bool serving)> f) {
    core_.OnServingChanged(std::move(f));
  }

 private:
  // A pass with its timer (pscluster_scheduler_pass_seconds{pass="NAME"}, owned by the core's
  // metrics).
  struct TimedPass {
    std::unique_ptr<Pass> pass;
    Histogram* seconds = nullptr;
  };

  Scheduler(const SchedulerOptions& options, Store* store, const Clock* clock, ClusterRpc* rpc,
            const PlacementPolicy* placement, bool view);
  // Fills control_passes_, poll_pass_ and moves_pass_ (called once, by the constructor).
  void DefinePasses();
  TimedPass Timed(std::unique_ptr<Pass> pass);
  static void RunPass(const TimedPass& pass);
  void Loop();
  void PollLoop();
  void MoveLoop();
  void ControlPass();

  // A worker's heartbeat lists a task that its job no longer gives it (the job ended, or the
  // rank was handed over while the worker was cut off): queues a StopTask for it.
  void StopUnwantedTasks(const v1::HeartbeatRequest& req);
  // Elastic changes (elastic.cc). Starts a change of the job's servers to `servers`
  // (persisted); the moves thread carries it out.
  absl::Status StartElasticLocked(JobRecord& rec, std::vector<std::string> servers,
                                  const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu());
  // Servers alive, in service and outside `exclude`, the fewest shards of running jobs first.
  std::vector<std::string> SpareServersLocked(const absl::flat_hash_set<std::string>& exclude)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu());
  absl::Status CheckClusterSize(const v1::JobSpec& spec, const std::string& source) const;
  // OK when `owner` may submit one more job under the core's quotas.
  absl::Status CheckQuotaLocked(const std::string& owner) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu());

  SchedulerCore core_;

  absl::Mutex loop_mu_;  // One ControlPass() at a time.
  // The control loop's passes in the order ControlPass runs them; the poll and moves threads'.
  std::vector<TimedPass> control_passes_;
  TimedPass poll_pass_;
  TimedPass moves_pass_;
  std::thread loop_;
  std::thread poll_loop_;
  std::thread move_loop_;
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_SCHEDULER_H_
