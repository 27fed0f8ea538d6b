// The scheduler's logic behind the Scheduler gRPC service: node registry, job queue and
// lifecycle, placement, shard maps, progress and cluster status, all persisted in SQLite.
//
// Thread model:
//  * RPC handlers (the methods named like the RPCs) run on gRPC's callback threads. They touch
//    memory and the Store (short SQLite transactions); only CheckpointJob, ExportJob
//    (job_data_rpcs.cc) and GetTaskLogs (task_logs_rpc.cc) call another daemon, the job's
//    servers or worker, outside the lock. Node RPCs are in node_rpcs.cc, job RPCs in
//    scheduler.cc, the elastic ones (scale, drain) in elastic.cc, MoveShard in shard_move.cc.
//  * Start() launches three threads, which make the other outgoing calls, outside the lock
//    (each pass is a method in a file of its own; DefinePasses in scheduler_loop.cc names them
//    and fixes their order, and times each into pscluster_scheduler_pass_seconds{pass=...}):
//    - the control loop (Loop, or RunOnce() driven by a test): expires leases, hands ranks over,
//      recovers and rolls back jobs, places queued jobs (UpdateShardMap to the servers,
//      AssignTask to the workers), stops tasks and drops jobs once they end, balances data, and
//      persists progress;
//    - the poll loop (PollLoop): asks the servers of running jobs for their Status (who a
//      waiting step waits for, per-shard load) every status_poll_interval / 2;
//    - the moves loop (MoveLoop, or RunMoves() in tests): carries out queued shard moves and the
//      rebalancer's, one at a time (a move's copy may take long; placement does not wait).
//  * `mu_` guards the job table (JobTable, job_table.h: the jobs in submission order and their
//    persistence, with the sticky store error) and the cleanup queue; the NodeRegistry and the
//    Store have their own locks. Lock order: mu_, then the registry's, then the store's.
// Ownership: the scheduler owns the registry and the job table; the Store, Clock, ClusterRpc and
// PlacementPolicy are owned by the caller and must outlive it.
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

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
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
#include "scheduler/membership.h"
#include "scheduler/node_registry.h"
#include "scheduler/placement.h"
#include "scheduler/progress_history.h"
#include "scheduler/quotas.h"
#include "scheduler/rebalance.h"
#include "scheduler/store.h"

namespace pscluster::scheduler {

struct SchedulerOptions {
  absl::Duration lease = absl::Seconds(10);          // Heartbeat lease of every node.
  absl::Duration tick = absl::Milliseconds(200);     // Control loop period (it also wakes on events).
  absl::Duration status_poll_interval = absl::Seconds(1);  // Server Status polls per running job.
  absl::Duration progress_persist_interval = absl::Seconds(2);  // Progress written at most this often.
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
  void SetQuotas(std::shared_ptr<const Quotas> quotas);

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
  absl::Status ClusterStatus(const v1::ClusterStatusRequest& req,
                             v1::ClusterStatusResponse* resp);
  absl::Status MoveShard(const v1::MoveShardRequest& req, v1::MoveShardResponse* resp);
  // Unlike the other handlers, calls the job's servers (outside the lock): an operator's
  // on-demand checkpoint.
  absl::Status CheckpointJob(const v1::CheckpointJobRequest& req,
                             v1::CheckpointJobResponse* resp);
  // Also calls out (the job's lead worker, outside the lock): an operator's on-demand export.
  absl::Status ExportJob(const v1::ExportJobRequest& req, v1::ExportJobResponse* resp);
  // psctl logs: the rank's output lines, from the worker that runs (or last ran) it
  // (scheduler/task_logs_rpc.cc).
  absl::Status GetTaskLogs(const v1::TaskLogsRequest& req, v1::TaskLogsResponse* resp);

  // Elastic servers (elastic.cc): a running job's set of servers grows or shrinks, a server is
  // drained of every job's shards; both carried out by live moves on the moves thread.
  absl::Status ScaleJob(const v1::ScaleJobRequest& req, v1::ScaleJobResponse* resp);
  absl::Status DrainServer(const v1::DrainServerRequest& req, v1::DrainServerResponse* resp);
  absl::Status UndrainServer(const v1::UndrainServerRequest& req,
                             v1::UndrainServerResponse* resp);

  // Carries out the queued shard moves (and, when due, the rebalancer's look), one after the
  // other; the moves thread calls it (tests call it directly).
  void RunMoves();

  // The scheduler's metrics (nodes by role and state, jobs by state, running jobs' progress,
  // call counters), for a MetricsHttpServer; RenderMetrics() is their Prometheus text.
  // Thread-safe.
  const MetricsRegistry& metrics() const { return metrics_; }
  // For the daemon's own families (its RPC latencies).
  MetricsRegistry* mutable_metrics() { return &metrics_; }
  std::string RenderMetrics() const { return metrics_.Render(); }

  const NodeRegistry& registry() const { return registry_; }

  // The store's state. A write that failed is a sticky error (leveldb's bg_error_): from then
  // on the scheduler publishes nothing (the control loop and the moves stop; SubmitJob,
  // CancelJob, MoveShard, RegisterNode and Deregister answer UNAVAILABLE naming the store) and
  // the control loop tries, every store_retry, to write to it again. Once that succeeds it
  // carries on from what the store holds, as after a restart (tasks verified, placements
  // redone); what the failed write held was never published. OK while the store works.
  // Thread-safe.
  absl::Status store_status() const;
  // Called with false when the store fails and true once it works again (the daemon sets gRPC
  // health to NOT_SERVING and back). REQUIRES: set before Start(); must not call back into the
  // scheduler.
  void OnServingChanged(std::function<void(bool serving)> f);

 private:
  // A call to make once a job has ended: stop a worker's task or drop a job on a server.
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
  // Placement calls prepared under the lock and made outside it.
  struct PlacementWork {
    std::string job_id;
    v1::JobSpec spec;
    v1::ShardMap map;
    std::vector<std::string> workers;  // node ids by rank
    v1::JobRecovery recovery;          // What the servers restore and where the workers resume.
  };

  Scheduler(const SchedulerOptions& options, Store* store, const Clock* clock, ClusterRpc* rpc,
            const PlacementPolicy* placement);
  absl::Status Restore();
  // Fills the job table from what the store holds (empty table), as at start-up: placements
  // redone, running jobs' tasks verified, recently ended jobs' cleanups queued again.
  void LoadJobsLocked(std::vector<StoredJob> stored) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the scheduler's families to metrics_ (called once, by the constructor).
  void RegisterMetrics();

  // A pass: one step of a loop, a method in a file of its own that looks at the job table
  // under mu_ and makes its calls to other daemons outside it. The Scheduler keeps their order
  // (DefinePasses, scheduler_loop.cc); RunPass times each run into
  // pscluster_scheduler_pass_seconds{pass="NAME"}.
  struct Pass {
    const char* name = "";
    void (Scheduler::*run)() = nullptr;
    Histogram* seconds = nullptr;  // Owned by metrics_.
  };
  // Fills control_passes_, poll_pass_ and moves_pass_ (called once, by the constructor).
  void DefinePasses();
  void RunPass(const Pass& pass);
  void Loop();
  void PollLoop();
  void ControlPass();
  void Wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Control-loop steps.
  void CheckLeases();
  // Once after a restart (past the start-up grace): asks the workers of running jobs whether
  // they still run their tasks; a rank whose worker does not is lost (a task handed out just
  // before the scheduler died, or one that ended unseen).
  void VerifyTasksAfterRestart();
  // Gives the lost ranks of running jobs to idle workers (or lets them leave the job, or starts
  // a rollback recovery). Its steps follow.
  void HandOverRanks();
  // A rank to hand over or to finish leaving, planned under the lock, carried out outside it.
  struct RankWork {
    std::string job_id;
    uint32_t rank = 0;
    std::string cause;
    std::string lost;  // Node that ran the rank.
    std::string spare, spare_address;
    v1::JobSpec spec;
    v1::ShardMap map;
    uint32_t num_workers = 0;
    v1::JobRecovery recovery;
    // The rank leaves the job instead (no idle worker; the job may shrink): `adopter` (rank)
    // reads its data from then on, on `adopter_address`.
    bool leave = false;
    uint32_t adopter = 0;
    std::string adopter_address;
  };
  using NodeIndex = absl::flat_hash_map<std::string, const v1::NodeStatus*>;
  // Whether some running job has a lost rank, an unfinished leaving or a dead worker.
  bool AnyRankToHandOver();
  // Chooses an idle worker per lost rank and assigns the rank to it in the job (persisted), or
  // records that the rank leaves; returns what to tell the nodes.
  std::vector<RankWork> PlanHandOversLocked(const std::vector<v1::NodeStatus>& nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An idle live worker of `nodes` (not in `busy`) that can run the job's task; `old`, the one
  // that ran it, only when no other is idle if `avoid_old`, else first. Empty: none.
  static std::string IdleWorkerFor(const v1::JobSpec& spec, const std::string& old,
                                   bool avoid_old, const std::vector<v1::NodeStatus>& nodes,
                                   const absl::flat_hash_set<std::string>& busy);
  // Records that `rank` of `rec` leaves the job (persisted); the live rank still training that
  // reads the fewest parts takes its data, and the data of the ranks it had taken over. nullopt:
  // it may not (fewer than spec.min_workers live ranks would remain) or the write failed.
  std::optional<RankWork> LeaveRankLocked(JobRecord& rec, uint32_t rank, const std::string& cause,
                                          const NodeIndex& by_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static RankWork RankWorkOf(const JobRecord& rec, uint32_t rank, const std::string& cause,
                             const std::string& lost);
  // Fences the rank on every server, starts its task on the spare at its slowest clock, and
  // records the hand-over (or starts a rollback recovery naming what failed).
  void CarryOutHandOver(const RankWork& work);
  // Whether losing server `node` leaves a live copy of every shard it was primary of.
  bool CanPromote(const JobRecord& rec, const std::string& node) const;
  // Stops every RECOVERING job's tasks; then promotes its lost server's backups (promote_lost)
  // or drops it and rolls it back, queueing it to be placed again.
  void RecoverJobs();
  // After the tasks stopped: the new map to every server (promoted copies take over), and every
  // rank's task again, on its worker, at its lowest clock on the servers. On success the job
  // runs again; false (and the reason in *why) when the job must roll back instead.
  bool PromoteBackupsOf(const std::string& job_id, std::string* why);
  // After HandOverRanks recorded that `rank` left the job: every server takes it out of the
  // barrier, and the rank that takes its data (`adopter`; `rank` itself when none) and, if the
  // lead rank changed, every remaining rank get their new partition. A server that cannot be
  // told makes the job roll back instead.
  void FinishLeaving(const std::string& job_id, uint32_t rank, const std::string& cause,
                     const std::string& lost, const v1::ShardMap& map, uint32_t num_workers,
                     const v1::JobRecovery& recovery, uint32_t adopter,
                     const std::string& adopter_address);
  // Backups that their primary cannot reach (a partition between two servers) leave the
  // job's map, so that the primary's pushes go through again with fewer copies.
  void DropUnreachableBackups();
  // Shards that lost a backup that way get a new one, live, on another live server of the job's
  // map that their primary has not been cut from (none: they go on with a copy fewer).
  void ReplaceBackups();
  // Ranks that left running jobs come back on idle workers (while no job is queued): every
  // server lets the rank in again at the slowest clock of the ranks training, its task starts
  // there on the worker, and the rank that read its part meanwhile drops it.
  void RejoinRanks();
  // Data balancing (JobSpec.balance_data): from the ranks' measured compute rates, new data
  // shares for running jobs whose ranks are out of balance (data_balance.h); every rank gets its
  // new partition (a larger or smaller part and batch) from its next batch on.
  void BalanceData();
  // Places the queued jobs that are due: plans under the lock, calls the nodes outside it.
  void PlaceJobs();
  std::vector<PlacementWork> PlaceQueuedJobs();
  void ExecutePlacement(const PlacementWork& work);
  // Before a placement calls anyone: if a chosen worker still runs the task of a job that has
  // ended, puts the job back in the queue (the attempt not counted) and returns true.
  bool WaitForStoppingWorkers(const PlacementWork& work);
  void PollServers();
  void RunCleanups();
  // Whether one of `workers` (live, reachable) still runs a task of `job_id`.
  bool WorkerStillRuns(const std::vector<std::string>& workers, const std::string& job_id);
  void PersistProgress();
  // A worker's heartbeat lists a task that its job no longer gives it (the job ended, or the
  // rank was handed over while the worker was cut off): queues a StopTask for it.
  void StopUnwantedTasks(const v1::HeartbeatRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  void MoveLoop();
  // The moves thread's pass (RunMoves() runs it, timed).
  void CarryOutMoves();
  // Queues the moves the rebalancer picks for running jobs from their servers' shard loads.
  void Rebalance();
  // Moves the queued shard move of `job_id`: map 1 gives the target a live copy, map 2 (once
  // it has caught up) makes it the primary. Records the outcome in the job.
  void ExecuteMove(const std::string& job_id);
  // Elastic changes (elastic.cc). Starts a change of the job's servers to `servers`
  // (persisted); the moves thread carries it out.
  absl::Status StartElasticLocked(JobRecord& rec, std::vector<std::string> servers,
                                  const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next step of every running job's active change: queues its next move, takes a server
  // that holds nothing any more out of its map (outside the lock), or concludes it; ends
  // changes of jobs that stopped running; marks DRAINING servers no job uses any more DRAINED.
  void StepElastic();
  // Takes `node` (which holds none of its shards) out of the job's map: the new map to every
  // other server, then a DropJob on it.
  void RemoveServerFromJob(const std::string& job_id, const std::string& node);
  // Counts a finished move in the job's active change (a third failure stops the change).
  void CountElasticMove(JobRecord& rec, const v1::ShardMove& move, bool done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The CreateTables a server joining the job gets: the tables as `from` (the job's server at
  // `address`) declared them. FAILED_PRECONDITION when a rank has left the job.
  absl::StatusOr<v1::CreateTablesRequest> TablesFromPrimary(const std::string& job_id,
                                                            const v1::JobSpec& spec,
                                                            const std::string& from,
                                                            const std::string& address);
  // Servers alive, in service and outside `exclude`, the fewest shards of running jobs first.
  std::vector<std::string> SpareServersLocked(const absl::flat_hash_set<std::string>& exclude)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Queues a move of `job`'s `shard` to `to` (checks as MoveShard documents): of its primary
  // when `from` is empty or the primary, else of the backup `from` holds.
  absl::Status QueueMove(JobRecord& rec, uint32_t shard, const std::string& from,
                         const std::string& to, const std::string& reason,
                         v1::ShardMove* queued)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The table's listener: the first failed write of a run of failures (job_table.h).
  void OnStoreFailed(const absl::Status& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A registry call's failure: a store failure becomes the sticky store error (returned).
  absl::Status RegistryError(const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_);
  // With the store failed: when due, writes every node again and, if that works, reloads the
  // jobs from the store (what was not written was not published either) and clears the error.
  // Returns whether the store works.
  bool StoreWorks();
  // Moves a job to a final state, records why, and queues the calls that free its nodes.
  void Finish(JobRecord& rec, v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueCleanups(const JobRecord& rec, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Succeeds a running job once every rank reported done.
  void MaybeSucceed(JobRecord& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Best-effort StopTask / DropJob to nodes a failed placement had reached.
  void RollBack(const std::string& job_id, const std::vector<std::string>& servers,
                const std::vector<std::string>& workers, const std::string& reason);
  // Recovers (or, past max_recoveries, fails) the running jobs that use `node_id`, saying `what`
  // happened to it; jobs still being placed are placed again.
  void FailJobsOnNode(const std::string& node_id, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RUNNING -> RECOVERING (the control loop does the rest), or FAILED past max_recoveries.
  void StartRecovery(JobRecord& rec, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // False (and the job FAILED with `reason`) once it has recovered max_recoveries times.
  bool MayRecover(JobRecord& rec, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Describe(const std::string& node_id) const;
  absl::Status CheckClusterSize(const v1::JobSpec& spec, const std::string& source) const;
  // OK when `owner` may submit one more job under quotas_.
  absl::Status CheckQuotaLocked(const std::string& owner) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration StartupGrace() const;

  const SchedulerOptions options_;
  Store* const store_;
  const Clock* const clock_;
  ClusterRpc* const rpc_;
  const PlacementPolicy* const placement_;
  NodeRegistry registry_;
  const absl::Time started_;

  absl::Mutex loop_mu_;  // One RunOnce() at a time.
  // The control loop's passes in the order ControlPass runs them; the poll and moves threads'.
  std::vector<Pass> control_passes_;
  Pass poll_pass_;
  Pass moves_pass_;

  mutable absl::Mutex mu_;
  // The jobs and their persistence; its error() is the sticky store error (store_status()).
  JobTable jobs_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Quotas> quotas_ ABSL_GUARDED_BY(mu_);
  std::deque<Cleanup> cleanups_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool verify_tasks_ ABSL_GUARDED_BY(mu_) = false;  // Restored running jobs: VerifyTasks...().
  bool view_ = false;  // CreateView(): restored quietly, nothing queued.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread loop_;
  std::thread poll_loop_;
  std::thread move_loop_;
  bool moves_wanted_ ABSL_GUARDED_BY(mu_) = false;  // MoveShard queued one: RunMoves now.
  absl::Time next_store_retry_ ABSL_GUARDED_BY(mu_);
  std::function<void(bool)> serving_changed_;
  Counter* store_failures_ = nullptr;
  absl::Time next_rebalance_ ABSL_GUARDED_BY(mu_);

  // Metrics; the counters belong to metrics_ (set by RegisterMetrics(), never null after).
  MetricsRegistry metrics_;
  Counter* heartbeats_ = nullptr;
  Counter* registrations_ = nullptr;
  Counter* submissions_ = nullptr;
  Counter* progress_reports_ = nullptr;
  Counter* recoveries_ = nullptr;
  Counter* handovers_ = nullptr;
  Counter* promotions_ = nullptr;
  Counter* leaves_ = nullptr;
  Counter* rejoins_ = nullptr;
  Counter* backups_dropped_ = nullptr;
  Counter* data_rebalances_ = nullptr;
  Counter* backups_replaced_ = nullptr;
  Counter* moves_done_ = nullptr;
  Counter* moves_failed_ = nullptr;
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_SCHEDULER_H_
