// The parameter server's logic behind the gRPC edge: jobs, shard maps, the data plane entry
// points, checkpoints, export and status. Every method returns absl::Status with a message that
// names the request field at fault; bad input changes nothing.
//
// Thread model: all methods are thread-safe. `mu_` guards the tables (jobs, pending maps, each
// job's replication), the node's identity (node id, address, data port and socket) and the load
// samples; each Job synchronises its own state, and `checkpoint_mu_` serialises checkpoint
// writes. Periodic checkpoints are handed to the `background`
// runner given at construction (never run on the caller's thread).
#ifndef PSCLUSTER_SERVER_PS_HANDLER_H_
#define PSCLUSTER_SERVER_PS_HANDLER_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/data_auth.h"
#include "common/file_system.h"
#include "common/metrics.h"
#include "proto/ps.pb.h"
#include "server/backup_queue.h"
#include "server/job.h"
#include "server/memory_budget.h"
#include "server/payload.h"

namespace pscluster {

struct PsHandlerOptions {
  // Checkpoint directory for jobs that name none (--checkpoint_dir).
  std::string checkpoint_dir;
  // Roots (resolved, see common/path_root.h) that every checkpoint directory and restored file
  // (--checkpoint_root), and every export (--export_root), must lie in; empty = anywhere.
  std::string checkpoint_root;
  std::string export_root;
  // Bytes of parameters and optimizer state this server may hold; 0 = unlimited (PsServer
  // passes the machine's memory when --memory_bytes is 0).
  uint64_t memory_bytes = 0;
  // Disk tier of sparse tables (--spill_dir): when memory_bytes runs short, cold rows spill to
  // directories under it instead of pushes being refused. Empty: none.
  std::string spill_dir;
  DataPlaneLimits limits;
  // Periodic checkpoints kept per job (older ones are deleted).
  int keep_checkpoints = 3;
  // Replication: how long a Replicate call to a backup is retried before its pushes fail.
  absl::Duration replication_retry = absl::Seconds(10);
  // Where checkpoints and exports are written and read (null: FileSystem::Default(); tests
  // inject one that fails or crashes between steps). Must outlive the handler.
  FileSystem* fs = nullptr;
};

// A job's replication as this server's part of its shard map says (PsHandler's; attached to the
// Job so that each pushed chunk is forwarded with the state in force when it was applied).
struct JobReplication {
  uint64_t epoch = 0;
  std::string self;  // This server's node_id in the map (the primary named in Replicate).
  // As primary: the addresses of each shard's backups (empty: none).
  std::vector<std::vector<std::string>> backups;
  // Every server backing a shard held here (each gets the end-of-step markers).
  std::vector<std::string> backup_servers;
  // As backup: the copies held here, by primary node_id, and the shards of each.
  std::map<std::string, std::shared_ptr<Job>> replicas;
  std::map<std::string, std::vector<bool>> replica_shards;
  // As primary: the Replicate calls to each backup server, by address (see StartQueues).
  std::map<std::string, std::shared_ptr<BackupQueue>> queues;
  // As backup: live copies (ReplicaSeed.live), by primary: the snapshot as it arrives.
  struct Seed {
    absl::Mutex mu;
    // Received so far: in memory, or, for a copy with a disk tier, in a spool file.
    std::string bytes ABSL_GUARDED_BY(mu);
    std::shared_ptr<SpoolFile> spool ABSL_GUARDED_BY(mu);
    uint64_t received ABSL_GUARDED_BY(mu) = 0;  // Bytes received so far.
    uint64_t size ABSL_GUARDED_BY(mu) = 0;      // Announced by the first part.
    bool done ABSL_GUARDED_BY(mu) = false;      // Loaded into the copy.
    // Each worker's clock in the snapshot; caught up once each moved past it (cleared when
    // the primary's clocks came: caught up at once).
    std::vector<int64_t> clocks ABSL_GUARDED_BY(mu);
    // ReplicaSeed.held_from: the copy's new shards as this server's copy of their previous
    // primary held them when the map took effect here, and that copy's clocks before the map.
    // Loaded with the primary's clocks when they arrive (ReplicateRequest.clocks), or with
    // these clocks should this copy take over first. Updates of the copy's other shards are
    // applied meanwhile.
    std::optional<CheckpointSnapshot> held ABSL_GUARDED_BY(mu);
    Job::ClockState held_before ABSL_GUARDED_BY(mu);
    std::string held_from ABSL_GUARDED_BY(mu);  // For messages: "copy of X's shards".
    bool from_held ABSL_GUARDED_BY(mu) = false;  // Made with held_from (waits for clocks).
    // The primary's clocks and records of applied chunks arrived (ReplicateRequest.clocks, after
    // the snapshot or in place of it): the copy drops exactly what its primary applied, so it is
    // caught up at once.
    bool exact ABSL_GUARDED_BY(mu) = false;
  };
  std::map<std::string, std::shared_ptr<Seed>> seeds;
  // As primary: attached to the job (rep = this); see ForwardingState.
  ForwardingState forwarding;
};

// The job's view of `rep`'s forwarding (shares its ownership).
inline std::shared_ptr<ForwardingState> ForwardingOf(const std::shared_ptr<JobReplication>& rep) {
  return std::shared_ptr<ForwardingState>(rep, &rep->forwarding);
}

class PsHandler {
 public:
  using Runner = std::function<void(std::function<void()>)>;

  // `background` runs periodic checkpoints off the data path. REQUIRES: clock outlives this.
  PsHandler(PsHandlerOptions options, const Clock* clock, Runner background);
  ~PsHandler();

  // Identity reported in Status and used in checkpoint names (set after registration).
  void set_node_id(const std::string& id);
  void set_address(const std::string& address);
  // Port of the TCP data plane reported by Status (0: none).
  void set_data_port(uint32_t port);
  // The data plane's abstract Unix socket name (empty: none), reported with this process's id.
  void set_data_unix(std::string name);
  std::string node_id() const;
  // How this server reaches its shards' backups (PsServer: NewNetworkBackupTransport). Without
  // one, a job whose map gives this server's shards backups refuses pushes (FAILED_PRECONDITION).
  void set_backup_transport(std::shared_ptr<BackupTransport> transport);

  // ---- Control plane (one call each).
  absl::Status CreateTables(const v1::CreateTablesRequest& req, v1::CreateTablesResponse* resp);
  absl::Status UpdateShardMap(const v1::UpdateShardMapRequest& req,
                              v1::UpdateShardMapResponse* resp);
  absl::Status Checkpoint(const v1::CheckpointRequest& req, v1::CheckpointResponse* resp);
  absl::Status Restore(const v1::RestoreRequest& req, v1::RestoreResponse* resp);
  absl::Status Export(const v1::ExportRequest& req, v1::ExportResponse* resp);
  absl::Status DropJob(const v1::DropJobRequest& req, v1::DropJobResponse* resp);
  absl::Status Status(const v1::ServerStatusRequest& req, v1::ServerStatus* resp);
  absl::Status FenceWorker(const v1::FenceWorkerRequest& req, v1::FenceWorkerResponse* resp);
  // A chunk from the primary of shards this server backs up, applied to its copy.
  absl::Status Replicate(const v1::ReplicateRequest& req, v1::ReplicateResponse* resp);

  // ---- Data-connection authentication (common/data_auth.h; ps_handler_data_auth.cc).

  // Records the job's data secret (UpdateShardMapRequest.data_secret): INVALID_ARGUMENT unless
  // 32 bytes, PERMISSION_DENIED when the job already has a different one here.
  absl::Status SetDataSecret(const std::string& job_id, const std::string& secret);
  // The job's data secret ("" = none: its messages may come on unauthenticated connections).
  std::string DataSecret(const std::string& job_id) const;
  // Checks what a data connection claims (`hello`, answering `nonce`). OK: true when the
  // connection is now bound to hello.job_id, false when it gave no proof and may carry only
  // messages of jobs without a secret (refused with UNAUTHENTICATED when `proof_required`).
  // Refusals are logged with `peer`: PERMISSION_DENIED for a wrong proof, ABORTED for a fenced
  // attempt, UNAVAILABLE while this server has no secret for the job yet.
  absl::StatusOr<bool> AuthenticateData(const DataAuth& hello, const std::string& proof,
                                        const std::string& nonce, bool proof_required,
                                        const std::string& peer) const;
  // A gRPC call's proof of its job's data secret (the kGrpcDataAuthKey metadata, see
  // common/data_auth.h).
  struct GrpcDataProof {
    bool present = false;    // The metadata was sent.
    absl::Status malformed;  // Sent but unparsable.
    GrpcDataClaim claim;
    std::string peer;
  };
  // OK for a job without a data secret (standalone servers: the token check let the call
  // through), or when `proof` holds for `job`, `worker` and an attempt not fenced off; else
  // UNAUTHENTICATED (no or malformed proof) or PERMISSION_DENIED (another worker, a wrong proof),
  // logged with the peer.
  absl::Status CheckGrpcDataProof(const std::string& job, uint32_t worker,
                                  const GrpcDataProof& proof) const;
  // A page of a sparse table's keys held here as primary (ps.proto ListKeys); `proof` is the
  // call's, checked as a gRPC pull's.
  absl::Status ListKeys(const v1::ListKeysRequest& req, v1::ListKeysResponse* resp,
                        const GrpcDataProof& proof);

  // ---- Data plane.

  // One push chunk: validated, applied at most once, clocks advanced.
  absl::StatusOr<PushResult> Push(const v1::PushChunk& chunk, const Payload& values);

  // A validated pull request.
  struct PullPlan {
    std::shared_ptr<Job> job;
    std::vector<SliceRef> slices;
    v1::DataType dtype = v1::DT_FLOAT32;
  };
  absl::StatusOr<PullPlan> PlanPull(const v1::PullRequest& req);
  // The read a PushPull chunk with pull_after asks for (validated again, as a read).
  absl::StatusOr<PullPlan> PlanPullAfter(const v1::PushChunk& chunk);
  // Counts a pull request as served and `bytes` as sent.
  void CountPullServed() { pulls_total_.fetch_add(1, std::memory_order_relaxed); }
  void CountBytesOut(uint64_t bytes) { bytes_out_total_.fetch_add(bytes, std::memory_order_relaxed); }
  // Time spent per data-plane phase (reported in Status.times).
  enum class Phase { kParse, kQueue, kApply, kRead, kPark };
  static constexpr int kNumPhases = 5;
  void AddTime(Phase phase, absl::Duration d) {
    phase_ns_[static_cast<int>(phase)].fetch_add(absl::ToInt64Nanoseconds(d),
                                                 std::memory_order_relaxed);
    Histogram* h = phase_latency_[static_cast<int>(phase)].load(std::memory_order_acquire);
    if (h != nullptr) h->ObserveSeconds(d);
  }
  // Where each phase's durations are also observed one by one (the daemon's /metrics); null:
  // not observed. REQUIRES: the histograms outlive the handler.
  void SetPhaseHistogram(Phase phase, Histogram* h) {
    phase_latency_[static_cast<int>(phase)].store(h, std::memory_order_release);
  }
  void CountChunkIn() { chunks_in_.fetch_add(1, std::memory_order_relaxed); }
  void CountChunkOut() { chunks_out_.fetch_add(1, std::memory_order_relaxed); }
  // Requests accepted and not finished (maintained by the gRPC edge).
  void AddQueueDepth(int delta) { queue_depth_.fetch_add(delta, std::memory_order_relaxed); }

  // Takes a rate sample and the per-shard load of the window since the last tick. Called about
  // once a second by the daemon; returns what a heartbeat reports.
  void Tick(v1::Load* load, std::vector<v1::ShardLoad>* shard_loads);

  MemoryBudget* budget() { return &budget_; }

 private:
  // Longest a push's last chunk waits for its backups, beyond their queues' retry window.
  static constexpr absl::Duration kReplicationFlushSlack = absl::Seconds(20);
  // Node id, addresses, data sockets and pid: what even a brief Status carries.
  void FillIdentity(v1::ServerStatus* resp) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Totals {
    absl::Time at;
    uint64_t pushes = 0, pulls = 0, bytes_in = 0, bytes_out = 0;
  };
  absl::StatusOr<std::shared_ptr<Job>> FindJob(absl::string_view job_id, absl::string_view field) const;
  // Writes `snapshot` (taken now when null, recording step `at` when given) under
  // `dir_override` or the job's directory. A job with a disk tier is taken and written at once,
  // streamed (Job::StreamCheckpoint): its tables are never copied into memory.
  absl::StatusOr<v1::CheckpointResponse> WriteCheckpoint(
      const std::shared_ptr<Job>& job, const std::string& dir_override, bool periodic,
      std::shared_ptr<const Job::Snapshot> snapshot = nullptr,
      std::optional<int64_t> at = std::nullopt);
  void PruneCheckpoints(const std::string& dir, const std::string& prefix);
  std::string CheckpointPrefix() const;
  // Loads a recovering job's shards from `req.restore_from` into `job` (not yet published) and
  // sets every clock to `req.restore_step`.
  absl::Status RestoreForRecovery(Job& job, const v1::UpdateShardMapRequest& req);
  Totals CurrentTotals() const;

  using Replication = JobReplication;
  // Starts a queue per backup server of `rep` (none without a backup transport); a broken queue of
  // `old` for the same backup is kept.
  void StartQueues(Replication* rep, const Replication* old = nullptr);
  // After `map` took effect on the job (replication `old` -> `next`): a backup that stays one of
  // the job's servers but backs fewer (or none) of this server's shards gets what was queued for
  // it before this returns; a copy kept for a primary's other shards drops the shards it no
  // longer backs. UNAVAILABLE (after all that) when one of `holding` (addresses of backups that
  // keep their copy of a shard that moved from here) could not be given everything.
  absl::Status SettleOldReplication(const v1::ShardMap& map, const Replication& old,
                                    const Replication& next,
                                    const absl::flat_hash_set<std::string>& holding);
  // What `map` asks of `self` (replicas not created).
  static std::shared_ptr<Replication> PlanReplication(const v1::ShardMap& map,
                                                      const std::string& self);
  // Creates the copies `rep` plans for a job just created here with its tables (from the
  // initializer, the recovery's checkpoint files in `req`, or waiting for a live snapshot).
  absl::Status CreateReplicas(const Job& job, const v1::UpdateShardMapRequest& req,
                              Replication* rep);
  // A new copy of `primary`'s shards for `job`, loaded from its checkpoint `path` (clocks
  // included): a backup added in the middle of a run.
  absl::StatusOr<std::shared_ptr<Job>> SeedReplica(const Job& job, const std::vector<bool>& held,
                                                   uint64_t epoch, uint32_t min_attempt,
                                                   const std::string& primary,
                                                   const std::string& path);
  // A copy of `primary`'s shards `held` starting from the initializer (a live copy then waits
  // for its primary's snapshot).
  absl::StatusOr<std::shared_ptr<Job>> NewCopy(const Job& job, const std::vector<bool>& held,
                                               uint64_t epoch, uint32_t min_attempt);
  // For a newer map giving this server the shards `held`: copies still backed up are carried
  // into `next`; copies of shards now held here as primary (a promotion, or a shard moved here)
  // are to be taken over by the job (*adopt), the rest dropped. FAILED_PRECONDITION when such a
  // copy is a live one still waiting for its snapshot. `epoch`: the new map's.
  absl::Status PlanAdoptions(const Job& job, const Replication& old,
                             const std::vector<bool>& held, uint64_t epoch, Replication* next,
                             std::vector<Job::MapChange::Adoption>* adopt);
  // A primary's chunk (or, with `seed_part`, a part of its snapshot) for this server's copy of
  // its shards: Replicate over gRPC, or a PushChunk with replica_of over the TCP data port.
  absl::StatusOr<PushResult> ApplyToCopy(const std::string& primary, v1::PushChunk chunk,
                                         const Payload& values,
                                         const v1::ReplicateRequest* seed_part);
  // A part of a live copy's snapshot (ReplicateRequest.seed); the last part loads it.
  absl::Status ReceiveSeed(const v1::ReplicateRequest& req, Job& copy, JobReplication::Seed& seed);
  // A copy whose new shards this server held already (ReplicaSeed.held_from) takes them: their
  // values from the seed's snapshot, and the primary's clocks `primary_clocks` (its CopyClocks,
  // exactly), or, with none (this copy takes over before they came), its own clocks joined
  // with those the old copy had before the map. Done once; a repeat changes nothing.
  absl::Status LoadHeldCopy(Job& copy, JobReplication::Seed& seed,
                            const Job::ClockState* primary_clocks);
  // A copy seeded by its primary's snapshot takes the primary's clocks and records of applied
  // chunks sent right after it (ReplicateRequest.clocks). FAILED_PRECONDITION before the
  // snapshot; a repeat changes nothing.
  absl::Status TakeClocksAfterSnapshot(Job& copy, JobReplication::Seed& seed,
                                       const Job::ClockState& primary_clocks);
  // The copy that UpdateShardMap makes for `primary`'s shards `shards` from this server's copy of
  // `seed.held_from()`'s (it already holds the new ones): the copy kept for `primary`'s other
  // shards, or a new one; *made gets the pending seed.
  absl::StatusOr<std::shared_ptr<Job>> CopyFromHeld(const Job& job, const Replication* old,
                                                    const v1::UpdateShardMapRequest& req,
                                                    const std::string& primary,
                                                    const std::vector<bool>& shards,
                                                    std::shared_ptr<JobReplication::Seed>* made);
  // Queues the chunk `job` just applied (then Ends applied.forwarding) for the backups of its shard (not a duplicate: its copy
  // went when it was applied, or a copy made since holds it), the step's end for every backup
  // server, and at a push's last chunk waits until they have it all. UNAVAILABLE naming the
  // backup when one cannot be reached.
  absl::Status ForwardToBackups(const Replication& rep, const v1::PushChunk& chunk,
                                const Payload& values, const PushResult& applied);
  std::shared_ptr<Replication> FindReplication(const std::string& job_id) const;
  void SampleRates(double* push, double* pull, double* in, double* out);

  // options_.fs, or the POSIX file system.
  FileSystem* fs() const { return options_.fs != nullptr ? options_.fs : FileSystem::Default(); }

  const PsHandlerOptions options_;
  const Clock* const clock_;
  const Runner background_;
  const absl::Time started_;
  MemoryBudget budget_;

  mutable absl::Mutex secrets_mu_ ABSL_ACQUIRED_AFTER(mu_);
  absl::flat_hash_map<std::string, std::string> data_secrets_ ABSL_GUARDED_BY(secrets_mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  // Shard maps (with a recovery's restore files) that arrived before their job's tables.
  absl::flat_hash_map<std::string, v1::UpdateShardMapRequest> pending_maps_ ABSL_GUARDED_BY(mu_);
  std::string node_id_ ABSL_GUARDED_BY(mu_);
  std::string address_ ABSL_GUARDED_BY(mu_);
  uint32_t data_port_ ABSL_GUARDED_BY(mu_) = 0;
  std::string data_unix_ ABSL_GUARDED_BY(mu_);
  std::deque<Totals> samples_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ShardLoad> last_shard_loads_ ABSL_GUARDED_BY(mu_);
  absl::Time last_tick_ ABSL_GUARDED_BY(mu_);

  absl::Mutex checkpoint_mu_;  // One checkpoint write at a time.
  // Replication per job (replaced whole when the map changes; absent for jobs without backups).
  absl::flat_hash_map<std::string, std::shared_ptr<Replication>> replication_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<BackupTransport> backup_transport_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> pushes_total_{0};
  std::atomic<uint64_t> pulls_total_{0};
  std::atomic<uint64_t> duplicates_total_{0};
  std::atomic<uint64_t> bytes_in_total_{0};
  std::atomic<uint64_t> bytes_out_total_{0};
  std::atomic<int64_t> queue_depth_{0};
  std::atomic<int64_t> phase_ns_[kNumPhases] = {};
  std::atomic<Histogram*> phase_latency_[kNumPhases] = {};
  std::atomic<uint64_t> chunks_in_{0};
  std::atomic<uint64_t> chunks_out_{0};
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_PS_HANDLER_H_
