// The scheduler's core: what its RPC handlers and its passes share, and nothing else.
//
// A pass (passes.h) sees only the core: the job table and the cleanup queue under one lock, the
// node registry, the store, the calls to other daemons (ClusterRpc), the clock, the options, the
// metrics, and the steps of a job's life that handlers and passes both take (finish it, queue
// the calls that free its nodes, recover it, queue a shard move...). The Scheduler
// (scheduler.h) owns a core, answers the RPCs over it, and runs the passes in their order on
// its threads.
//
// Thread model: `mu()` guards the job table (JobTable, job_table.h: the jobs in submission order
// and their persistence, with the sticky store error), the cleanup queue, the quotas and the
// events between the threads (Wake, WantMoves, stopping). The NodeRegistry and the Store have
// their own locks. Lock order: mu(), then the registry's, then the store's. A method marked
// REQUIRES mu() is called with it held; every call to another daemon is made without it.
// Ownership: the core owns the registry, the job table and the metrics; the Store, Clock,
// ClusterRpc and PlacementPolicy are owned by the caller and must outlive it.
#ifndef PSCLUSTER_SCHEDULER_SCHEDULER_CORE_H_
#define PSCLUSTER_SCHEDULER_SCHEDULER_CORE_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/file_system.h"
#include "common/metrics.h"
#include "proto/scheduler.pb.h"
#include "scheduler/cluster_rpc.h"
#include "scheduler/data_balance.h"
#include "scheduler/job_table.h"
#include "scheduler/node_registry.h"
#include "scheduler/placement.h"
#include "scheduler/quotas.h"
#include "scheduler/rebalance.h"
#include "scheduler/store.h"

namespace pscluster::scheduler {

struct SchedulerOptions {
  absl::Duration lease = absl::Seconds(10);       // Heartbeat lease of every node.
  absl::Duration tick = absl::Milliseconds(200);  // Control loop period (it also wakes on events).
  absl::Duration status_poll_interval = absl::Seconds(1);  // Server Status polls per running job.
  absl::Duration progress_persist_interval =
      absl::Seconds(2);                                 // Progress written at most this often.
  absl::Duration placement_backoff = absl::Seconds(2);  // Wait before retrying a refused placement.
  int max_placement_attempts = 5;  // Then the job fails with the last refusal as its reason.
  // A job that ends before its workers are done (cancelled, failed) is dropped on its servers
  // once its workers have stopped their tasks, or after this long: a server that forgets the
  // job while a worker's push or pull is in flight fails that call.
  absl::Duration task_stop_grace = absl::Seconds(2);
  // Oversized jobs (more servers or workers than the cluster has) are refused at submission
  // once the scheduler has run this long (before that, nodes may still be re-registering).
  absl::Duration startup_grace = absl::ZeroDuration();  // 0 = one lease.
  // Recoveries per job from lost nodes; one more loss fails it (0 = a lost node fails the job).
  int max_recoveries = 3;
  // Live shard moves (MoveShard, and the rebalancer's): how long a target's copy may take to
  // catch up with the primary before the move is given up.
  absl::Duration move_copy_timeout = absl::Seconds(60);
  // Rebalancing: how often running jobs' shard loads are looked at (0 = never), and when a
  // server counts as overloaded (see rebalance.h). A job moves at most one shard per look.
  absl::Duration rebalance_every = absl::ZeroDuration();
  RebalanceOptions rebalance;
  // Data balancing of jobs with balance_data (every = 0: never).
  DataBalanceOptions data_balance;
  std::string version = "0.1.0";
  // With the store failed: how often the control loop tries to write its state again.
  absl::Duration store_retry = absl::Seconds(1);
  // --checkpoint_root (a ResolveRoot result; empty = unconfined): the checkpoints the scheduler
  // reads to find a recovery point, a job's checkpoint_dir and CheckpointJob's dir must lie
  // under it; outside it, PERMISSION_DENIED naming the root.
  std::string checkpoint_root;
  // Where the recovery scan lists and reads checkpoint files (tests inject one that fails or
  // has crashed; common/testing/fault_injection_fs.h). REQUIRES: outlives the scheduler.
  FileSystem* checkpoint_fs = FileSystem::Default();
  // --quota_file: limits per submitting identity (quotas.h); nullptr = none. SetQuotas replaces
  // them (SIGHUP).
  std::shared_ptr<const Quotas> quotas;
};

// A call to make once a job has ended: stop a worker's task or drop a job on a server. The
// cleanup pass (cleanup_pass.cc) makes them, retrying while the node stays live.
struct Cleanup {
  bool drop_job = false;  // true: DropJob on a server; false: StopTask on a worker.
  std::string node_id;
  std::string job_id;
  std::string reason;
  int attempts = 0;
  absl::Time not_before;
  // DropJob only: until this time, wait while one of these workers still runs the job's task
  // (the servers keep its tables while its workers stop; see task_stop_grace).
  std::vector<std::string> stopping_workers;
  absl::Time stop_deadline;
  // DropJob of a copy left on a server that came back after its jobs moved away, or StopTask
  // of a task its worker still runs though the job no longer gives it that rank: done unless
  // the job holds that node again (whatever the job's state).
  bool stale_copy = false;
};

// The scheduler's counters (owned by the core's metrics; never null once the core is made).
struct SchedulerCounters {
  Counter* heartbeats = nullptr;
  Counter* registrations = nullptr;
  Counter* submissions = nullptr;
  Counter* progress_reports = nullptr;
  Counter* recoveries = nullptr;
  Counter* handovers = nullptr;
  Counter* promotions = nullptr;
  Counter* leaves = nullptr;
  Counter* rejoins = nullptr;
  Counter* backups_dropped = nullptr;
  Counter* data_rebalances = nullptr;
  Counter* backups_replaced = nullptr;
  Counter* moves_done = nullptr;
  Counter* moves_failed = nullptr;
  Counter* store_failures = nullptr;
};

class SchedulerCore {
 public:
  // `view`: a follower's read-only view (Scheduler::CreateView): jobs restored quietly, nothing
  // queued; rpc and placement may then be null.
  // REQUIRES: store, clock, rpc and placement outlive the core.
  SchedulerCore(const SchedulerOptions& options, Store* store, const Clock* clock, ClusterRpc* rpc,
                const PlacementPolicy* placement, bool view);
  SchedulerCore(const SchedulerCore&) = delete;
  SchedulerCore& operator=(const SchedulerCore&) = delete;

  // Fills the registry and the job table from the store (at start-up). Jobs caught in
  // placement are placed again (same shard map); running jobs' tasks are verified; recently
  // ended jobs' cleanups are queued again.
  absl::Status Restore() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- What the core works with, fixed for its life ----
  const SchedulerOptions& options() const { return options_; }
  Store& store() const { return *store_; }
  const Clock& clock() const { return *clock_; }
  // REQUIRES: not a view.
  ClusterRpc& rpc() const { return *rpc_; }
  const PlacementPolicy& placement() const { return *placement_; }
  NodeRegistry& registry() { return registry_; }
  const NodeRegistry& registry() const { return registry_; }
  bool view() const { return view_; }
  // When the core was made, and how long after that nodes may still be re-registering.
  absl::Time started() const { return started_; }
  absl::Duration StartupGrace() const;
  MetricsRegistry& metrics() { return metrics_; }
  const MetricsRegistry& metrics() const { return metrics_; }
  const SchedulerCounters& counters() const { return counters_; }

  // ---- Shared state, under mu() ----
  absl::Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }
  JobTable& jobs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return jobs_; }
  const JobTable& jobs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return jobs_; }
  std::deque<Cleanup>& cleanups() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cleanups_; }
  // The quotas submissions are checked against (nullptr: none).
  const Quotas* quotas() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return quotas_.get(); }
  void SetQuotas(std::shared_ptr<const Quotas> quotas) ABSL_LOCKS_EXCLUDED(mu_);
  // Restored running jobs: the verify-tasks pass asks their workers once, after the grace.
  bool verify_tasks() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return verify_tasks_; }
  void clear_verify_tasks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { verify_tasks_ = false; }
  // The rebalancer's next look (the moves pass's schedule; absl::Time() before the first).
  absl::Time next_rebalance() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_rebalance_; }
  void set_next_rebalance(absl::Time t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { next_rebalance_ = t; }

  // ---- Events between the threads ----
  // The control loop runs a pass now (something changed).
  void Wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { wake_ = true; }
  // The moves thread runs now (a move was queued, or a change has its next step).
  void WantMoves() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { moves_wanted_ = true; }
  // Returns and clears WantMoves().
  bool TakeMovesWanted() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the threads were asked to stop (a move waiting for its copy gives up then).
  bool stopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; }
  void SetStopping(bool stopping) ABSL_LOCKS_EXCLUDED(mu_);
  // The threads' waits; each returns false once stopping. The control loop's: until Wake() or
  // `timeout` (and clears the wake). The moves thread's: until WantMoves(), the rebalancer's
  // next look, or `idle`. The poll thread's: `timeout`.
  bool WaitForWork(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  bool WaitForMoves(absl::Duration idle) ABSL_LOCKS_EXCLUDED(mu_);
  bool WaitUnlessStopping(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- The store ----
  // OK, or the sticky error of a failed write (job_table.h). Thread-safe.
  absl::Status store_status() const ABSL_LOCKS_EXCLUDED(mu_);
  // A registry call's failure: a store failure becomes the sticky store error (returned).
  absl::Status RegistryError(const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_);
  // With the store failed: when due, writes every node again and, if that works, reloads the
  // jobs from the store (what was not written was not published either) and clears the error.
  // Returns whether the store works.
  bool StoreWorks() ABSL_LOCKS_EXCLUDED(mu_);
  // Called with false when the store fails and true once it works again. REQUIRES: set before
  // the threads start; must not call back into the core.
  void OnServingChanged(std::function<void(bool serving)> f) { serving_changed_ = std::move(f); }

  // ---- Steps of a job's life, shared by handlers and passes ----
  // Moves a job to a final state, records why, and queues the calls that free its nodes.
  void Finish(JobRecord& rec, v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueCleanups(const JobRecord& rec, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Succeeds a running job once every rank reported done.
  void MaybeSucceed(JobRecord& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recovers (or, past max_recoveries, fails) the running jobs that use `node_id`, saying `what`
  // happened to it; jobs still being placed are placed again.
  void FailJobsOnNode(const std::string& node_id, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether losing server `node` leaves a live copy of every shard it was primary of.
  bool CanPromote(const JobRecord& rec, const std::string& node) const;
  // RUNNING -> RECOVERING (the recovery pass does the rest), or FAILED past max_recoveries.
  void StartRecovery(JobRecord& rec, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // False (and the job FAILED with `reason`) once it has recovered max_recoveries times.
  bool MayRecover(JobRecord& rec, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a move of `job`'s `shard` to `to` (checks as MoveShard documents): of its primary
  // when `from` is empty or the primary, else of the backup `from` holds.
  absl::Status QueueMove(JobRecord& rec, uint32_t shard, const std::string& from,
                         const std::string& to, const std::string& reason, v1::ShardMove* queued)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The epoch of `rec`'s next shard map, above `current` (Store::NextEpoch: current + 1, or an
  // etcd revision). A failure is the sticky store error (returned): the map must not be sent.
  absl::StatusOr<uint64_t> NextEpoch(const JobRecord& rec, uint64_t current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a finished move in the job's active change (a third failure stops the change).
  void CountElasticMove(JobRecord& rec, const v1::ShardMove& move, bool done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Calls to other daemons (without mu()) ----
  // Whether one of `workers` (live, reachable) still runs a task of `job_id`.
  bool WorkerStillRuns(const std::vector<std::string>& workers, const std::string& job_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Best-effort StopTask / DropJob to nodes a failed placement had reached.
  void RollBack(const std::string& job_id, const std::vector<std::string>& servers,
                const std::vector<std::string>& workers, const std::string& reason)
      ABSL_LOCKS_EXCLUDED(mu_);

  // "node-3 at 10.0.0.3:7000" (the id alone for a node the registry does not know).
  std::string Describe(const std::string& node_id) const;

 private:
  // Adds the scheduler's families to metrics_ (scheduler_metrics.cc; once, by the constructor).
  void RegisterMetrics();
  // The table's listener: the first failed write of a run of failures (job_table.h).
  void OnStoreFailed(const absl::Status& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills the job table from what the store holds (empty table), as at start-up.
  void LoadJobsLocked(std::vector<StoredJob> stored) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SchedulerOptions options_;
  Store* const store_;
  const Clock* const clock_;
  ClusterRpc* const rpc_;
  const PlacementPolicy* const placement_;
  const bool view_;
  NodeRegistry registry_;
  const absl::Time started_;
  MetricsRegistry metrics_;
  SchedulerCounters counters_;
  std::function<void(bool)> serving_changed_;

  mutable absl::Mutex mu_;
  // The jobs and their persistence; its error() is the sticky store error (store_status()).
  JobTable jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<Cleanup> cleanups_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Quotas> quotas_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool moves_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool verify_tasks_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time next_rebalance_ ABSL_GUARDED_BY(mu_);
  absl::Time next_store_retry_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_SCHEDULER_CORE_H_
