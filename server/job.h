// One job's state on a server: its tables (the shards held here), composed with the protocols
// that govern them, each a class of its own:
//   WorkerClocks   (worker_clocks.h)   each rank's clock, the fences of replaced attempts, ranks
//                                      that left;
//   ReadGate       (read_gate.h)       the BSP/SSP/ASP policy: when a pull may be served, and
//                                      the pulls parked until then;
//   AppliedRecord  (applied_record.h)  the exactly-once record of applied push chunks;
//   StepAggregator (step_aggregator.h) the sums of a step under synchronous aggregation.
// Job validates requests against them, applies updates to the tables, and takes checkpoints.
//
// Thread model: every public method is thread-safe. `state_mu_` is a reader/writer lock: data-
// plane calls (Push, Read) hold it shared and lock individual blocks/stripes; shard-map changes,
// checkpoints, restores and new tables hold it exclusively. `clock_mu_` guards the clocks, the
// read gate and the exactly-once record; it is never held while table memory is touched. The
// aggregator locks itself (after `clock_mu_` when both are held). `advance_mu_` serialises what follows a clock advance (applying aggregated steps,
// releasing parked pulls) so that pulls are released in clock order after the step's update.
// Callbacks of parked pulls run on the thread that advanced the clock, with no lock held.
#ifndef PSCLUSTER_SERVER_JOB_H_
#define PSCLUSTER_SERVER_JOB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/checkpoint_file.h"
#include "common/clock.h"
#include "proto/ps.pb.h"
#include "server/memory_budget.h"
#include "server/applied_record.h"
#include "server/payload.h"
#include "server/pull_views.h"
#include "server/read_gate.h"
#include "server/spool_file.h"
#include "server/step_aggregator.h"
#include "server/table.h"
#include "server/worker_clocks.h"

namespace pscluster {

// How a job was declared (CreateTablesRequest without the tables).
struct JobConfig {
  std::string job_id;
  v1::ConsistencySpec consistency;
  uint32_t num_workers = 1;
  uint32_t num_shards = 0;
  uint32_t checkpoint_every_steps = 0;
  std::string checkpoint_dir;
  // The server's --spill_dir (empty: none): sparse tables spill cold rows to a directory of
  // their own under it when the memory budget is short (not in aggregate mode).
  std::string spill_dir;
};

// A validated part of a table.
struct SliceRef {
  uint32_t table = 0;           // Index into the job's tables.
  bool dense = true;
  uint64_t block = 0;           // DENSE.
  std::vector<uint64_t> keys;   // SPARSE.
  uint64_t elems = 0;           // Elements of the whole slice.
  uint64_t keys_hash = 0;       // SPARSE: identity of the key list (for the dedup record).
};

// A checkpoint file as taken in memory, or spooled to local disk.
struct CheckpointSnapshot {
  std::string bytes;   // The whole checkpoint file (empty when it was streamed to a file).
  // The whole checkpoint file, when it was spooled (a copy of a job with a disk tier for another
  // copy to load; `bytes` is then empty). Shared: the file lives while a holder does.
  std::shared_ptr<const SpoolFile> spool;
  int64_t step = 0;
  uint32_t crc = 0;
  uint64_t size = 0;  // Bytes of the file.
};

// The bytes of `snap` to read a piece at a time (from its spool file or from memory; valid while
// `snap` is).
std::unique_ptr<CheckpointSource> SourceOf(const CheckpointSnapshot& snap);

// What a primary forwards its applied chunks with (PsHandler's replication state for the job);
// opaque here.
struct JobReplication;

// The forwarding in force for a job (a member of its JobReplication). It counts the chunks
// applied with it that are not yet handed to their backups' queues, so that a map change can
// wait until every chunk applied before it is queued.
struct ForwardingState {
  const JobReplication* rep = nullptr;  // The owner.
  void Begin() {
    absl::MutexLock l(&mu);
    ++in_flight;
  }
  void End() {
    absl::MutexLock l(&mu);
    --in_flight;
  }
  // Waits until every chunk Begun is Ended.
  void AwaitHandedOver() {
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(+[](int* n) { return *n == 0; }, &in_flight));
  }
  absl::Mutex mu;
  int in_flight ABSL_GUARDED_BY(mu) = 0;
};

struct PushResult {
  // The forwarding in force when the chunk was applied (null: none), Begun for this chunk: a
  // chunk applied after a map change is forwarded with the new map's, one applied before it
  // with the old one's. The caller Ends it once the chunk is queued for the backups.
  std::shared_ptr<ForwardingState> forwarding;
  bool duplicate = false;  // Acknowledged, not applied (tag seen before).
  bool applied = false;    // Values applied (or added to the step's aggregate).
  int64_t clock = 0;       // The worker's clock after the chunk.
  // Virtual shard of the chunk's slice (kNoShard: a chunk with no slice).
  static constexpr uint32_t kNoShard = ~0u;
  uint32_t shard = kNoShard;
  // A periodic checkpoint this push made due (the slowest clock crossed a multiple of N), taken
  // before any read at the new clock was served; to be written by the caller.
  std::shared_ptr<const CheckpointSnapshot> checkpoint;
  // Sparse tables with admission or expiry: what was done with each key, for the copies
  // (PushChunk.row_decisions); empty otherwise.
  std::string row_decisions;
};

// Limits that protect the server from oversized requests.
struct DataPlaneLimits {
  uint64_t max_chunk_bytes = 16 << 20;  // `values` of one chunk.
  uint64_t max_keys = 1 << 20;          // Keys in one sparse slice.
};

class Job {
 public:
  // `tables` must have been validated. REQUIRES: budget and clock outlive the job.
  Job(JobConfig config, MemoryBudget* budget, const Clock* clock, DataPlaneLimits limits);
  ~Job();

  const JobConfig& config() const { return config_; }
  const std::string& id() const { return config_.job_id; }

  // ---- Control plane.

  // Declares tables (already validated, with resolved optimizers). Existing tables with an
  // identical spec are kept; a different spec is ALREADY_EXISTS naming the table. All or
  // nothing. Returns the number of tables created.
  absl::StatusOr<uint32_t> AddTables(const std::vector<v1::TableSpec>& specs,
                                     const std::vector<OptimizerParams>& optimizers);
  // Installs the shards held for `epoch` (ignored when not newer, unless it is the first map).
  // Blocks of newly held shards start from the initializer; blocks and rows of shards no longer
  // held are freed. RESOURCE_EXHAUSTED (and nothing changes) when new blocks do not fit.
  absl::Status SetShards(uint64_t epoch, std::vector<bool> held);
  // Every worker's clock and the record of the chunks applied for its recent steps.
  struct ClockState {
    std::vector<int64_t> clocks;
    std::vector<std::map<int64_t, absl::flat_hash_set<uint64_t>>> applied;
    std::vector<bool> left;  // Workers that left the job (Leave).
  };
  // What else changes with a newer map, atomically with it: no push or read is served between
  // the shards changing and these taking effect.
  struct MapChange {
    // Copies whose shards are newly held here (promotion, a move): restored into them, their
    // clocks joined as AdoptReplica does. Named by `from` in errors.
    struct Adoption {
      CheckpointSnapshot copy;
      std::vector<int64_t> clocks;
      std::vector<std::map<int64_t, absl::flat_hash_set<uint64_t>>> applied;
      std::string from;
    };
    std::vector<Adoption> adopt;
    // Replaces the forwarding that pushes report (PushResult::forwarding).
    std::shared_ptr<ForwardingState> forwarding;
    // Called with a checkpoint of the job as the map takes effect (live copies' seeds), still
    // under the lock: what it queues goes ahead of every later chunk's copies. Empty: none.
    std::function<void(CheckpointSnapshot)> seed;
    // Called, like `seed` and right after it, with the job's clocks and records of applied
    // chunks as the map takes effect (after the adoptions): for new backups that hold their
    // shards' copies already (ReplicaSeed.held_from). Empty: none.
    std::function<void(const ClockState&)> clocks;
    std::string node_id;  // For the seed's header.
    // The virtual shards the seed must cover (those the new copies back); its dense blocks are
    // of these shards only. Empty: every shard held here.
    std::vector<bool> seed_shards;
  };
  // SetShards with `change` (which must be for a newer map, or the first one). Reads parked at
  // the older epoch fail (FAILED_PRECONDITION: their clients refresh the map and retry).
  absl::Status SetShards(uint64_t epoch, std::vector<bool> held, MapChange change);
  // Sets the forwarding attachment outside a map change (a job not yet serving).
  void SetForwarding(std::shared_ptr<ForwardingState> forwarding);
  uint64_t epoch() const;
  // The tables as declared, with their resolved optimizers (to declare them again elsewhere).
  void Declared(std::vector<v1::TableSpec>* specs, std::vector<OptimizerParams>* optimizers) const;
  // Whether the shard map in force gives this server `shard` (as primary).
  bool HoldsShard(uint32_t shard) const;
  // FAILED_PRECONDITION (older) or UNAVAILABLE (newer) unless `epoch` is the one in force.
  absl::Status CheckRequestEpoch(uint64_t epoch) const;
  // Forgets everything; parked pulls finish with NOT_FOUND.
  void Drop();

  // ---- Fencing (Tag.attempt): a rank handed to a newer task refuses the older one's calls.

  // Refuses pushes and reads of `worker` with an attempt below `attempt` from now on (ABORTED;
  // never lowered). Returns (the worker's clock, the fence in force): no older attempt can
  // advance that clock any more, so a new task may resume the rank there.
  std::pair<int64_t, uint32_t> Fence(uint32_t worker, uint32_t attempt);
  // Fences every worker at `attempt` (a placement whose tasks all run that attempt).
  void FenceAll(uint32_t attempt);
  // `worker` leaves the job for good: every attempt of it is refused from now on, and no read,
  // aggregate step or copy's catching up waits for its clock any more. Parked reads that only
  // waited for it are released (their callbacks run before this returns, with no lock held).
  // Returns the worker's clock, final now. Idempotent; the last worker never leaves
  // (FAILED_PRECONDITION).
  absl::StatusOr<int64_t> Leave(uint32_t worker);
  // A worker that left takes part again, refusing its attempts below `attempt`: its clock
  // becomes the slowest clock of the workers in the job (where its new task resumes), returned.
  // FAILED_PRECONDITION when it has not left.
  absl::StatusOr<int64_t> Rejoin(uint32_t worker, uint32_t attempt);
  // Whether `worker` left the job (false for a rank outside it).
  bool HasLeft(uint32_t worker) const;
  // The ranks that left, ascending.
  std::vector<uint32_t> LeftWorkers() const;
  // ABORTED when `attempt` of `worker` is fenced off. `field` names the attempt's field.
  absl::Status CheckAttempt(uint32_t worker, uint32_t attempt, absl::string_view field) const;
  bool dropped() const { return dropped_.load(); }

  // ---- Data plane.

  // Validates one push chunk and applies it exactly once (see the class comment). Every error
  // names the field at fault and leaves the job unchanged. A periodic checkpoint that the push
  // makes due comes back in the result (its header naming `node_id`): reads at the new clock
  // wait until it is taken, so that under BSP it holds exactly the steps up to that clock.
  // A job with a disk tier does not copy its tables into memory for that: `stream_checkpoint`
  // is called with the checkpoint's step instead (before any read at the new clock is served)
  // and writes it (StreamCheckpoint); it returns false to have it taken in memory after all.
  absl::StatusOr<PushResult> Push(const v1::PushChunk& chunk, const Payload& values,
                                  absl::FunctionRef<std::string()> node_id,
                                  absl::FunctionRef<bool(int64_t at)> stream_checkpoint);
  absl::StatusOr<PushResult> Push(const v1::PushChunk& chunk, const Payload& values,
                                  absl::FunctionRef<std::string()> node_id) {
    return Push(chunk, values, node_id, [](int64_t) { return false; });
  }
  absl::StatusOr<PushResult> Push(const v1::PushChunk& chunk, const Payload& values) {
    return Push(chunk, values, [] { return std::string(); });
  }

  // Validates a slice for reading at `epoch`. `field` prefixes error messages ("slices[2]").
  absl::StatusOr<SliceRef> ResolveForRead(const v1::Slice& slice, uint64_t epoch,
                                          absl::string_view field) const;
  // Validates the rest of a read request: worker rank, its attempt (fencing), clock and dtype.
  absl::Status CheckReader(uint32_t worker, uint32_t attempt, int64_t clock, v1::DataType dtype,
                           absl::string_view worker_field, absl::string_view dtype_field) const;
  // Whether a read at `clock` may be served now; if not, parks `ready` (called once, later,
  // with OK when it may, or an error when the job is dropped) and returns its id in *wait_id.
  bool WhenReadable(int64_t clock, std::function<void(absl::Status)> ready, uint64_t* wait_id);
  // Forgets a parked read (its callback will not be called). False if it already ran.
  bool CancelWait(uint64_t wait_id);
  // For a read of a slice that worker `worker` has just pushed in the round that ends its step
  // `step` (PushChunk.step_final; its contribution to the slice is applied and it pushes the
  // slice no more this step): whether the read at `clock` may be served now because every
  // other worker's clock allows it. Sets *min_clock to the clock the read then reflects. Always
  // false in aggregate mode (updates land only when the step completes everywhere); parks
  // nothing, so a false answer is followed by WhenReadable.
  bool ReadableAfterOwnPush(int64_t clock, uint32_t worker, int64_t step, int64_t* min_clock);
  // Reads elements [first, first + n) of a slice, encoded as `dtype`, into `out`.
  // FAILED_PRECONDITION when the shard map moved past `epoch` meanwhile.
  absl::Status Read(const SliceRef& slice, uint64_t epoch, uint64_t first, uint64_t n,
                    v1::DataType dtype, char* out);
  // A whole dense block for `worker`'s pull of a table with pull compression, the worker holding
  // view `held` (PushChunk.pull_view): only what moved most since, or the whole block
  // (PullViews::Encode). FAILED_PRECONDITION as Read. REQUIRES: slice.dense.
  absl::StatusOr<PullViews::Reply> ReadView(const SliceRef& slice, uint64_t epoch,
                                            uint32_t worker, uint64_t held, v1::DataType dtype);
  // Like Read for a dense slice in float32, but lends the weights instead of copying them.
  // REQUIRES: slice.dense.
  absl::StatusOr<LentBytes> Lend(const SliceRef& slice, uint64_t epoch, uint64_t first,
                                 uint64_t n);
  // Records one served pull (for the staleness statistics); returns the min clock.
  // `min` >= 0: the clock the read reflected (ReadableAfterOwnPush), instead of the min clock.
  int64_t RecordServedPull(int64_t reader_clock, int64_t min = -1);
  // Bytes per element on the wire for `dtype` (float32 for DT_INVALID).
  static v1::DataType TransportType(v1::DataType requested) {
    return requested == v1::DT_INVALID ? v1::DT_FLOAT32 : requested;
  }
  uint32_t table_width(uint32_t table) const;  // SPARSE row width; 1 for dense.

  // ---- Checkpoints and export.

  using Snapshot = CheckpointSnapshot;
  // `at`: the step to record (default: the slowest clock, or the last applied aggregate step).
  absl::StatusOr<Snapshot> MakeCheckpoint(const std::string& node_id, int64_t now_unix_ms,
                                          std::optional<int64_t> at = std::nullopt);
  // Writes a checkpoint as MakeCheckpoint takes one, but through the writer that `open` returns
  // once the step and the file's size are known (Snapshot.bytes stays empty): no table is copied
  // into memory, and a table with a disk tier is read again from both tiers for each of its
  // sections, so a table far larger than memory is checkpointed in bounded memory. Updates wait
  // until it returns.
  using CheckpointOpener =
      absl::FunctionRef<absl::StatusOr<CheckpointWriter*>(int64_t step, uint64_t bytes)>;
  absl::StatusOr<Snapshot> StreamCheckpoint(const std::string& node_id, int64_t now_unix_ms,
                                            std::optional<int64_t> at, CheckpointOpener open);
  // Whether a table has a disk tier (its checkpoints are then streamed, not taken in memory).
  bool HasDiskTier() const ABSL_LOCKS_EXCLUDED(state_mu_);
  // Verifies `file` (checksum, layout, table specs) and only then replaces the shards it covers
  // that are held here, and (with `set_clocks`) the clocks. Returns (step, tables restored).
  absl::StatusOr<std::pair<int64_t, uint32_t>> Restore(const std::string& file,
                                                       absl::string_view path,
                                                       bool set_clocks = true);
  // The same, reading the checkpoint a piece at a time (a file far larger than memory).
  absl::StatusOr<std::pair<int64_t, uint32_t>> Restore(CheckpointSource& source,
                                                       absl::string_view path,
                                                       bool set_clocks = true);
  // Each worker's clock as recorded in the checkpoint `file` (checked as Restore does).
  static absl::StatusOr<std::vector<int64_t>> CheckpointClocks(const std::string& file,
                                                               absl::string_view path);
  static absl::StatusOr<std::vector<int64_t>> CheckpointClocks(CheckpointSource& source,
                                                               absl::string_view path);

  // ---- Replication: a backup's copy of a primary's shards taking over on promotion.

  ClockState GetClockState() const;
  // A ClockState on the wire (ReplicateRequest.clocks), and back: INVALID_ARGUMENT names a rank
  // outside the job's `num_workers`, a clock or step out of range, or a rank given twice.
  static void ClocksToProto(const ClockState& state, v1::CopyClocks* out);
  static absl::StatusOr<ClockState> ClocksFromProto(const v1::CopyClocks& in,
                                                    uint32_t num_workers);
  // A copy takes its primary's clocks and records of applied chunks as they are (the primary's
  // CopyClocks, sent where its own snapshot would have gone): each rank's clock becomes the
  // primary's, known from now on, and the record of applied chunks is replaced. Ranks that left
  // stay as they are (FenceWorker reaches every copy).
  void SetClockState(const ClockState& state);
  // A checkpoint of `shards` only (a subset of those held; its dense blocks and sparse rows are
  // theirs), for another copy on this server to take them over (ReplicaSeed.held_from).
  // Spooled for a job with a disk tier, as every snapshot made for another copy of the job.
  absl::StatusOr<Snapshot> CheckpointShards(const std::string& node_id, int64_t now_unix_ms,
                                            const std::vector<bool>& shards);
  // A checkpoint of the whole job for another copy on this server to load (a copy taking over
  // its shards); with `seal` (a copy about to be taken over), this copy refuses every later
  // update (FAILED_PRECONDITION), so that none lands after the snapshot, taken at the same instant. For a job with a disk tier it is
  // spooled to an anonymous file under the spill directory, read twice (its sections streamed
  // from both tiers), so a copy far larger than memory changes hands in bounded memory; in
  // memory otherwise.
  absl::StatusOr<Snapshot> SnapshotForCopy(const std::string& node_id, int64_t now_unix_ms,
                                           bool seal);
  // The directory a copy of this job spools what it receives to (a live copy's seed): the spill
  // directory when a table has a disk tier, else empty (kept in memory).
  std::string SpoolDir() const ABSL_LOCKS_EXCLUDED(state_mu_);
  // A copy: the primary applied the next chunk at shard-map epoch `epoch`. Before the first
  // chunk of each newer epoch the copy keeps its clock state, for ClockStateBefore. Call before
  // applying the chunk; chunks from one primary come in the order it applied them.
  void NoteSourceEpoch(uint64_t epoch);
  // The clock state of a copy before the first chunk its primary applied at `epoch` or later
  // (the current one when there is none). A server that takes a shard over at map epoch M adopts
  // these clocks: its old primary applied no chunk of that shard at M, but went on with its other
  // shards, and their step ends (which a copy kept for those shards receives too) must not make
  // the moved shard's missing chunks of that step look like duplicates.
  ClockState ClockStateBefore(uint64_t epoch) const;
  // Takes over the shards of `copy` (a replica's checkpoint) that are held here (SetShards
  // first) and joins its clocks: each worker's clock becomes the lower of the two and the
  // records of applied chunks unite, so a worker resuming at its lowest clock re-pushes what
  // either side lacks and every chunk either side applied is a duplicate. Call only while no
  // worker pushes (the job's tasks are stopped).
  absl::Status AdoptReplica(const Snapshot& copy, const ClockState& clocks,
                            absl::string_view from);
  // A server that joins a running job (its first map names a live copy): no rank's clock is
  // known here; each rank's first push sets it (a push may be any step ahead), or the copy's
  // clocks when it is taken over.
  void ClocksUnknown();
  // After a recovery's restore: every worker's clock becomes `step` (the step the job resumes
  // from), with no pushes remembered or buffered. Call before any worker reads.
  void RewindClocks(int64_t step);
  // Safetensors bytes of the named tables (all dense ones when empty). Returns tensor count.
  absl::StatusOr<std::pair<std::string, uint32_t>> Export(const std::vector<std::string>& tables);
  // The keys >= start of sparse table `table` that hold a row in the shards this server is
  // primary of, increasing, at most `limit` into *keys; returns whether more remain. Holds the
  // job's state exclusively meanwhile (as a checkpoint does). NOT_FOUND names an unknown table,
  // INVALID_ARGUMENT a dense one; a stale epoch is FAILED_PRECONDITION (CheckEpoch).
  absl::StatusOr<bool> ListKeys(const std::string& table, uint64_t epoch, uint64_t start,
                                size_t limit, std::vector<uint64_t>* keys);

  void NoteCheckpoint(const std::string& path, absl::Time when);

  // ---- Status.

  void FillStatus(v1::JobOnServer* out) const;
  // Frees the sparse rows that have expired for every later push (EmbeddingSpec); returns how
  // many. Takes one stripe lock at a time, so pushes and pulls go on meanwhile; does nothing
  // (returns 0) while a map change or a checkpoint holds the job.
  uint64_t CollectExpired();
  // Adds (job, shard, bytes, requests) for every shard with traffic since the last call.
  void TakeShardLoads(double window_sec, std::vector<v1::ShardLoad>* out);
  int64_t min_clock() const;

 private:
  struct TableState {
    std::unique_ptr<TableInfo> info;
    std::unique_ptr<DenseTable> dense;
    std::unique_ptr<SparseTable> sparse;
  };
  absl::Status CheckEpoch(uint64_t epoch, absl::string_view field) const
      ABSL_SHARED_LOCKS_REQUIRED(state_mu_);
  absl::Status SetShardsLocked(uint64_t epoch, std::vector<bool> held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // SetShards with `change`; the reads parked until then go to *parked.
  absl::Status SetShardsChanging(uint64_t epoch, std::vector<bool> held, MapChange change,
                                 std::vector<ReadGate::Callback>* parked);
  // `only` (nullptr = all): the shards the checkpoint covers (its header lists the held ones
  // among them; its dense blocks and sparse rows are theirs).
  absl::StatusOr<Snapshot> MakeCheckpointLocked(const std::string& node_id, int64_t now_unix_ms,
                                                std::optional<int64_t> at,
                                                const std::vector<bool>* only = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // MakeCheckpointLocked, spooled when a table has a disk tier (see SnapshotForCopy).
  absl::StatusOr<Snapshot> MakeCopyLocked(const std::string& node_id, int64_t now_unix_ms,
                                          const std::vector<bool>* only)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // Writes the checkpoint (of `only`, as above) through the writer `open` returns; sets `snap`'s
  // step, crc and size.
  absl::Status WriteCheckpointLocked(const std::string& node_id, int64_t now_unix_ms,
                                     std::optional<int64_t> at, const std::vector<bool>* only,
                                     CheckpointOpener open, Snapshot* snap)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  bool HasDiskTierLocked() const ABSL_SHARED_LOCKS_REQUIRED(state_mu_);
  absl::StatusOr<std::pair<int64_t, uint32_t>> RestoreLocked(CheckpointSource& source,
                                                             absl::string_view path,
                                                             bool set_clocks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // Joins another copy's clocks and records of applied chunks into this one's (AdoptReplica).
  void JoinClocksLocked(const std::vector<int64_t>& clocks,
                        const std::vector<std::map<int64_t, absl::flat_hash_set<uint64_t>>>& applied)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(clock_mu_);
  absl::StatusOr<SliceRef> Resolve(const v1::Slice& slice, absl::string_view field) const
      ABSL_SHARED_LOCKS_REQUIRED(state_mu_);
  // The dense block of `s`, or FAILED_PRECONDITION when it is no longer held here.
  absl::StatusOr<DenseBlock*> HeldBlock(const SliceRef& s) const
      ABSL_SHARED_LOCKS_REQUIRED(state_mu_);
  // Sparse tables with admission or expiry: *row_decisions gets what was done with each key
  // (PushChunk.row_decisions), for the copies.
  absl::Status ApplyValues(const SliceRef& s, const v1::PushChunk& chunk, const Payload& values,
                           v1::DataType dtype, uint64_t n, std::string* row_decisions)
      ABSL_SHARED_LOCKS_REQUIRED(state_mu_);
  absl::Status Aggregate(const SliceRef& s, const v1::PushChunk& chunk, const Payload& values,
                         v1::DataType dtype, uint64_t n) ABSL_SHARED_LOCKS_REQUIRED(state_mu_);
  // After clocks moved: applies finished aggregate steps and releases parked reads. When a
  // periodic checkpoint falls due, reads stay held and *hold gets the new clock instead: the
  // caller takes the snapshot, then calls ReleaseHeld().
  // The callbacks of released reads go to *ready, to be run once no lock is held.
  void AfterAdvance(std::vector<ReadGate::Callback>* ready, int64_t* hold)
      ABSL_SHARED_LOCKS_REQUIRED(state_mu_);
  // Applies a finished aggregate step's sums to the tables.
  void ApplyAggregated(int64_t step_no, StepAggregator::Step* step)
      ABSL_SHARED_LOCKS_REQUIRED(state_mu_);
  // Lets reads up to clock `min` through (after a held checkpoint's snapshot).
  void ReleaseHeld(int64_t min, std::vector<ReadGate::Callback>* ready);
  absl::StatusOr<PushResult> PushLocked(const v1::PushChunk& chunk, const Payload& values,
                                        std::vector<ReadGate::Callback>* ready, int64_t* hold)
      ABSL_SHARED_LOCKS_REQUIRED(state_mu_);
  void CountShard(uint32_t shard, uint64_t bytes);
  uint32_t ShardOfSlice(const SliceRef& s) const ABSL_SHARED_LOCKS_REQUIRED(state_mu_);

  const JobConfig config_;
  MemoryBudget* const budget_;
  const Clock* const clock_;
  const DataPlaneLimits limits_;
  std::atomic<bool> dropped_{false};

  mutable absl::Mutex state_mu_;
  std::vector<TableState> tables_ ABSL_GUARDED_BY(state_mu_);
  absl::flat_hash_map<std::string, uint32_t> table_index_ ABSL_GUARDED_BY(state_mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(state_mu_) = 0;
  bool have_map_ ABSL_GUARDED_BY(state_mu_) = false;
  std::vector<bool> held_ ABSL_GUARDED_BY(state_mu_);
  std::shared_ptr<ForwardingState> forwarding_ ABSL_GUARDED_BY(state_mu_);
  bool sealed_ ABSL_GUARDED_BY(state_mu_) = false;  // SnapshotForCopy(seal).


  absl::Mutex advance_mu_ ABSL_ACQUIRED_BEFORE(clock_mu_);
  mutable absl::Mutex clock_mu_;
  WorkerClocks clocks_ ABSL_GUARDED_BY(clock_mu_);
  AppliedRecord applied_ ABSL_GUARDED_BY(clock_mu_);
  ReadGate gate_ ABSL_GUARDED_BY(clock_mu_);
  StepAggregator agg_;  // Aggregate mode only; thread-safe.
  // The step of the last periodic checkpoint that fell due.
  int64_t checkpointed_step_ ABSL_GUARDED_BY(clock_mu_) = 0;
  // A copy: the highest epoch its primary applied a chunk at, and the clock state before the
  // first chunk of each of its latest epochs (NoteSourceEpoch).
  // Written under clock_mu_; read without it first, so that a chunk of a known epoch (all but
  // the first of each map) takes no lock here.
  std::atomic<uint64_t> source_epoch_{0};
  std::map<uint64_t, ClockState> clocks_before_epoch_ ABSL_GUARDED_BY(clock_mu_);
  std::string last_checkpoint_ ABSL_GUARDED_BY(clock_mu_);
  absl::Time last_checkpoint_time_ ABSL_GUARDED_BY(clock_mu_) = absl::InfinitePast();

  PullViews pull_views_;  // Pull compression: what each worker holds of each block.
  std::unique_ptr<std::atomic<uint64_t>[]> shard_bytes_;
  std::unique_ptr<std::atomic<uint64_t>[]> shard_requests_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_JOB_H_
