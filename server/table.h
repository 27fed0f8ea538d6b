// Storage of one table's part on this server, with the optimizer applied in place.
//
// A dense table is cut into blocks of block_elems elements; the server allocates the blocks of
// the virtual shards it holds. A sparse table maps uint64 keys to rows of row_width elements,
// created by the first push of the key with the table's initializer (admission permitting, see
// EmbeddingPolicy) and spread over lock stripes; a pull of a key without a row reads the
// initializer's values and creates nothing. Each element
// carries its optimizer slots beside it (block: [weights | slot0 | slot1], row likewise).
//
// Thread model: Apply/Read/VisitRows may run concurrently from many threads (each block and each
// stripe has its own mutex). SetHeldShards, DropUnheld, Load* and Clear need exclusive access
// to the table (the owning job's writer lock).
#ifndef PSCLUSTER_SERVER_TABLE_H_
#define PSCLUSTER_SERVER_TABLE_H_

#include <atomic>
#include <deque>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "proto/job.pb.h"
#include "server/embedding_policy.h"
#include "server/initializer.h"
#include "server/memory_budget.h"
#include "server/optimizer.h"
#include "server/payload.h"
#include "server/recent_touches.h"
#include "server/row_store.h"
#include "server/step_counts.h"

namespace pscluster {

// Produces gradient elements [first, first + n) (relative to the start of the update) as float32.
using GradientFn = absl::FunctionRef<void(size_t first, size_t n, float* out)>;

// The declared, validated description of a table, shared by its dense or sparse storage.
struct TableInfo {
  v1::TableSpec spec;        // As declared (block_elems filled in for dense tables).
  uint64_t hash = 0;         // TableHash(name).
  OptimizerParams optimizer;
  Initializer init;
  uint32_t num_shards = 0;   // Virtual shards of the job.
  uint64_t elems = 0;        // DENSE: product of the shape.
  uint32_t width = 0;        // SPARSE: row width.

  TableInfo(const v1::TableSpec& s, const OptimizerParams& o, uint32_t shards);
  bool dense() const { return spec.kind() == v1::DENSE; }
  // Floats stored per parameter element (weights plus slots).
  size_t floats_per_elem() const { return 1 + static_cast<size_t>(optimizer.num_slots()); }
};

// One block: its weights and optimizer slots. The weights are shared with pulls being sent
// (no copy) and never change while shared: a writer that finds them shared copies first.
struct DenseBlock {
  DenseBlock(size_t n, int num_slots);
  absl::Mutex mu;
  const size_t elems;
  const int slots;
  StepCounts steps ABSL_GUARDED_BY(mu);                   // Optimizer steps per element (Adam's t).
  std::shared_ptr<float> weights ABSL_GUARDED_BY(mu);      // elems floats.
  std::unique_ptr<float[]> slot_data ABSL_PT_GUARDED_BY(mu);  // slots * elems floats.
  size_t bytes() const { return (1 + static_cast<size_t>(slots)) * elems * sizeof(float); }
  // The weights for writing (copied first if a pull still holds them).
  float* MutableWeights() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  uint64_t copies_on_write ABSL_GUARDED_BY(mu) = 0;
};

// Dense blocks this process copied before an update because lent weights were still held.
uint64_t DenseCopiesOnWrite();

// Weights lent out without a copy: `data` points into memory `owner` keeps unchanged.
struct LentBytes {
  std::shared_ptr<const void> owner;
  const char* data = nullptr;
  size_t size = 0;
};

class DenseTable {
 public:
  explicit DenseTable(const TableInfo* info);
  ~DenseTable();

  uint64_t num_blocks() const { return num_blocks_; }
  uint64_t block_elems() const { return block_elems_; }
  uint64_t BlockLen(uint64_t b) const;
  uint32_t ShardOf(uint64_t b) const;

  // Allocates (initialised) the blocks of held shards and frees the others; all or nothing.
  // RESOURCE_EXHAUSTED names the table and the limit when the budget is short.
  absl::Status SetHeldShards(const std::vector<bool>& held, MemoryBudget* budget);
  // nullptr when the block is not held here.
  DenseBlock* block(uint64_t b) const { return b < blocks_.size() ? blocks_[b].get() : nullptr; }

  // Applies a gradient for elements [offset, offset + n) of block `b`: one optimizer step for
  // each of those elements (Adam's t counts per element, so a block pushed in chunks of any
  // split and order, or only in part, is updated as if pushed whole). `step` is the training
  // step the gradient belongs to (it sets a scheduled learning rate).
  void Apply(DenseBlock* b, uint64_t offset, size_t n, GradientFn grad, int64_t step = 0);
  // The same, with the gradient read in place from a received payload (elements [0, n) of
  // `dtype`) wherever it is aligned float32, so the optimizer streams it without a copy.
  void ApplyPayload(DenseBlock* b, uint64_t offset, size_t n, const Payload& grad,
                    v1::DataType dtype, int64_t step = 0);
  // Writes elements [offset, offset + n) of the weights, encoded as `dtype`, to `out`.
  void Read(DenseBlock* b, uint64_t offset, size_t n, v1::DataType dtype, char* out);
  // Lends elements [offset, offset + n) of the float32 weights without copying them.
  LentBytes Lend(DenseBlock* b, uint64_t offset, size_t n);

  uint64_t blocks_held() const;
  uint64_t elements_held() const;
  uint64_t bytes_held() const;
  // Frees every block (job dropped).
  void Clear(MemoryBudget* budget);

 private:
  const TableInfo* info_;
  uint64_t block_elems_;
  uint64_t num_blocks_;
  std::vector<std::unique_ptr<DenseBlock>> blocks_;
};

class SparseTable {
 public:
  static constexpr int kStripes = 64;

  // `clock` (may be null: time stands still) times expiry in seconds. `spill_path` (empty:
  // none) is the directory of the table's disk tier: when the memory budget is short, the least
  // recently used rows (a clock sweep per stripe) move there with their optimizer state and
  // step counts (the clock's candidates pushed least often lately go first), and come back when
  // a push finds them pushed more often lately than the rows spilled lately (else the push
  // updates them where they lie, on disk); pulls read them in place. The directory is made
  // at the first spill and removed with the table.
  // REQUIRES: the clock outlives the table; the parent of `spill_path` exists.
  explicit SparseTable(const TableInfo* info, const Clock* clock = nullptr,
                       std::string spill_path = "");
  ~SparseTable();

  // What a push did with each key of a table with a policy (EmbeddingSpec), one RowDecision
  // byte per key: `follow` (a copy's: the primary's decisions) when not empty, else `made`.
  struct Decisions {
    std::string follow;
    std::string made;
  };
  // Counts of the table's policy since it was made (TableStatus).
  struct PolicyCounts {
    uint64_t admissions = 0;
    uint64_t not_admitted = 0;
    uint64_t expiries = 0;
    uint64_t reads_without_row = 0;
    uint64_t sketch_bytes = 0;
    // Disk tier.
    uint64_t rows_on_disk = 0;
    uint64_t ram_hits = 0;    // Row touches (pushes and pulls) that found the row in memory.
    uint64_t disk_reads = 0;  // Row touches that found it on disk (pushes bring it back).
    uint64_t spills = 0;      // Rows moved to disk.
    uint64_t updated_on_disk = 0;  // Pushes applied to a row where it lay on disk.
  };

  uint32_t ShardOf(uint64_t key) const;

  // Calls f(i, row, updates) for each keys[i] (in stripe order, each under its stripe's lock),
  // creating missing rows with the initializer (pushes in aggregate mode; Apply without a
  // policy). `row` points at [weights | slots] of the row.
  // All or nothing: the memory of every new row is taken from the budget before any row is
  // touched, and RESOURCE_EXHAUSTED (naming the table, the rows and the limit) when it does not
  // fit leaves the table as it was.
  absl::Status VisitRows(absl::Span<const uint64_t> keys, MemoryBudget* budget,
                         absl::FunctionRef<void(size_t i, float* row, int64_t* updates)> f);

  // Applies gradient rows to `keys` for training step `step`. REQUIRES: keys are distinct; grad
  // gives rows in key order. With a policy, each key is admitted, counted or restarted as
  // `decisions` says or (without one to follow) as the policy decides, all or nothing as to
  // memory; INVALID_ARGUMENT when decisions to follow do not match the keys.
  absl::Status Apply(absl::Span<const uint64_t> keys, GradientFn grad, MemoryBudget* budget,
                     int64_t step = 0, Decisions* decisions = nullptr);
  // Writes the weights of keys[i] (encoded as `dtype`) at out + i * width * DTypeSize(dtype):
  // a key without a row (or with an expired one) reads the initializer's values. Creates
  // nothing.
  void Read(absl::Span<const uint64_t> keys, v1::DataType dtype, char* out);

  const EmbeddingPolicy& policy() const { return policy_; }
  // The count filter's sketch (null without one): checkpoints carry its counts, restores add
  // them back. Thread-safe (the sketch is).
  CountMinSketch* admission_sketch() { return policy_.mutable_sketch(); }
  // Removes the rows that have expired for every push at a step >= min_clock (see
  // EmbeddingPolicy::Collectable); returns how many. Takes one stripe lock at a time.
  uint64_t CollectExpired(int64_t min_clock, MemoryBudget* budget);
  // Rows looked at on disk by one CollectExpired (a slice of the disk tier in key order, the
  // next call going on from where it stopped): expired rows there are freed a slice at a time,
  // without a pass over a disk tier of 10^8 rows on every call.
  static constexpr uint64_t kDiskSweepRows = 65536;
  PolicyCounts policy_counts() const;

  // Drops rows whose shard is not held (exclusive access).
  void DropUnheld(const std::vector<bool>& held, MemoryBudget* budget);
  // Drops rows whose shard is in `shards` (exclusive access; used by restore).
  void DropShards(const std::vector<bool>& shards, MemoryBudget* budget);
  // The keys >= start of the rows held here in shards `held` (in memory and on the disk tier;
  // rows that expired are not), increasing, at most `limit` of them into *keys (replaced).
  // Returns whether keys above the last one remain (exclusive access).
  bool ListKeys(uint64_t start, size_t limit, const std::vector<bool>& held,
                std::vector<uint64_t>* keys);
  // Every row as (key, updates, [weights | slots]) sorted by key (exclusive access).
  void ForEachRowSorted(absl::FunctionRef<void(uint64_t key, int64_t updates, const float* row)> f);
  // The same with the step of each row's last push (0 without expiry).
  void ForEachRowSortedWithStep(
      absl::FunctionRef<void(uint64_t key, int64_t updates, int64_t last_step, const float* row)> f);
  // Inserts or replaces a row (exclusive access), as last pushed at `step` (expiry).
  absl::Status PutRow(uint64_t key, int64_t updates, const float* row, MemoryBudget* budget,
                      int64_t step = 0);
  // A tiered table: rows held in neither tier (exclusive access; a restore after DropShards)
  // written straight to the disk tier, none of them passing through memory, in ascending key
  // order where the caller can (faster; any order is right): as whole files of the disk tier
  // (RowStore::BulkLoad), counted as each file is added. Add the rows, then Finish. Errors name
  // the table and the directory.
  class DiskLoad {
   public:
    absl::Status Add(uint64_t key, int64_t updates, int64_t last_step, const float* row);
    absl::Status Finish();

   private:
    friend class SparseTable;
    DiskLoad(SparseTable* table, std::unique_ptr<RowStore::BulkLoad> load)
        : table_(table), load_(std::move(load)) {}
    absl::Status Added(absl::Status s, uint64_t added);
    SparseTable* const table_;
    std::unique_ptr<RowStore::BulkLoad> load_;
    int64_t max_last_step_ = 0;  // Of the rows added.
  };
  // FAILED_PRECONDITION for a table without a disk tier.
  absl::StatusOr<std::unique_ptr<DiskLoad>> StartDiskLoad();
  // A row as the disk tier keeps it: updates, the step of its last push, the time of this call,
  // then its floats (weights and optimizer slots).
  std::string EncodeDiskRow(int64_t updates, int64_t last_step, const float* row) const;

  uint64_t rows() const;  // In memory and on disk.
  uint64_t bytes_held() const;  // In memory.
  bool tiered() const { return !spill_path_.empty(); }
  // Calls (pulls and pushes) whose disk reads were shared out among threads.
  uint64_t shared_calls() const { return shared_calls_.load(std::memory_order_relaxed); }
  // Rows a push found among those a pull had just read from disk (Stripe::read_back), so not
  // read again.
  uint64_t read_back_hits() const { return read_back_hits_.load(std::memory_order_relaxed); }
  void Clear(MemoryBudget* budget);

 private:
  struct Stripe {
    absl::Mutex mu;
    absl::flat_hash_map<uint64_t, uint32_t> index ABSL_GUARDED_BY(mu);  // key -> row id
    std::vector<std::unique_ptr<float[]>> pages ABSL_GUARDED_BY(mu);
    std::vector<uint64_t> keys ABSL_GUARDED_BY(mu);     // row id -> key
    std::vector<int64_t> updates ABSL_GUARDED_BY(mu);   // row id -> optimizer steps
    // With expiry only: row id -> step and time (ms) of its last push.
    std::vector<int64_t> last_step ABSL_GUARDED_BY(mu);
    std::vector<int64_t> last_ms ABSL_GUARDED_BY(mu);
    // With a disk tier only: row ids whose rows moved to disk (reused first), and per row id:
    // whether it holds a row, whether it was touched since the clock hand passed, and how many
    // calls between their two phases need it to stay (not spilled).
    std::vector<uint32_t> free_ids ABSL_GUARDED_BY(mu);
    std::vector<uint8_t> live ABSL_GUARDED_BY(mu);
    std::vector<uint8_t> referenced ABSL_GUARDED_BY(mu);
    std::vector<uint16_t> pins ABSL_GUARDED_BY(mu);
    uint32_t hand ABSL_GUARDED_BY(mu) = 0;  // The clock hand: next row id to look at.
    // Counts the changes to this stripe's rows on disk (a row spilled, updated where it lies,
    // brought back or freed): what a call read from disk for the stripe stays true while this
    // does not move, and for one key while the key is not among the changes since.
    uint64_t disk_gen ABSL_GUARDED_BY(mu) = 0;
    // The calls holding what they read from disk between their two phases, and while there are
    // any, the keys changed on disk with the disk_gen of each change, oldest first (at most
    // kDiskChangesKept; changes at gens <= disk_changes_floor are not among them).
    uint32_t readers ABSL_GUARDED_BY(mu) = 0;
    std::vector<std::pair<uint64_t, uint64_t>> disk_changes ABSL_GUARDED_BY(mu);
    uint64_t disk_changes_floor ABSL_GUARDED_BY(mu) = 0;
    // Rows a pull read from disk lately, as the disk holds them (at most kReadBackRows, the
    // oldest dropped first), so that the push of the same rows that follows a pull in training
    // does not read them again. A row leaves when it changes on disk (NoteDiskChange).
    absl::flat_hash_map<uint64_t, std::string> read_back ABSL_GUARDED_BY(mu);
    std::deque<uint64_t> read_back_order ABSL_GUARDED_BY(mu);
  };
  static constexpr size_t kReadBackRows = 128;  // A stripe's: 8,192 rows a table.
  // Keeps `row`, read from disk for `key`, in s->read_back.
  static void KeepReadBack(Stripe* s, uint64_t key, const std::string& row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  // Empties every stripe's read_back (rows written to disk other than through NoteDiskChange).
  void ForgetReadBack();
  static constexpr size_t kDiskChangesKept = 8192;
  // Records a change to `key`'s row on disk in `s` (see Stripe::disk_gen).
  static void NoteDiskChange(Stripe* s, uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  // The keys of `s` whose rows on disk changed since disk_gen was `gen`: false when that is not
  // known (then any may have), else true with *keys set (empty when none did).
  static bool DiskChangesSince(const Stripe* s, uint64_t gen, absl::flat_hash_set<uint64_t>* keys)
      ABSL_SHARED_LOCKS_REQUIRED(s->mu);
  // A call done with what it read from `s` between its phases.
  static void EndDiskRead(Stripe* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  // Whether a call over `keys` reads the disk tier from several threads (RunShared): a tiered
  // table with rows on disk and a call of at least kSharedKeys keys, on a machine of more than
  // one core.
  bool ShareDiskReads(size_t keys);
  static constexpr size_t kSharedKeys = 512;
  std::atomic<uint64_t> shared_calls_{0};
  std::atomic<uint64_t> read_back_hits_{0};
  // Runs `body` on the calling thread and, with `shared`, at the same time on the other threads
  // of a process-wide pool (one fewer than the cores); returns when every run that started has
  // returned. A pool thread that comes free only after the caller's own run has returned does
  // nothing, so a busy pool never delays the caller. `body` takes its stripes from a shared
  // counter (each once, whoever runs it).
  static void RunShared(bool shared, absl::FunctionRef<void()> body);
  // Stripe positions of `keys` sorted by stripe: order[count[s] .. count[s+1]) are stripe s's.
  static void SortByStripe(absl::Span<const uint64_t> keys, int* count,
                           std::vector<uint32_t>* order);
  absl::Status ApplyWithPolicy(absl::Span<const uint64_t> keys, GradientFn grad,
                               MemoryBudget* budget, int64_t step, Decisions* decisions);
  // Writes the row `id` back to its initial values and optimizer state.
  void Restart(Stripe* s, uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  int64_t NowMs() const;
  static int StripeOf(uint64_t key);
  float* RowPtr(Stripe* s, uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  // Finds or creates the row of `key`. A new row takes its bytes from `*reserved` (bytes already
  // taken from the budget for this call) while they last, else from `budget`; nullptr when the
  // budget is exhausted.
  // With a disk tier, a row found there is brought back (*loaded set) instead of made; a disk
  // error leaves nothing changed and comes back in *error (nullptr returned).
  // `known` (optional): what the disk holds for `key` (empty: nothing), read since its last
  // change there (Stripe::disk_gen), so that it is not read again.
  float* FindOrCreate(Stripe* s, uint64_t key, MemoryBudget* budget, uint64_t* reserved,
                      int64_t** updates, bool* loaded = nullptr, absl::Status* error = nullptr,
                      const std::string* known = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  bool has_meta() const { return policy_.expires() || tiered(); }
  // ---- Disk tier (table_tier.cc).
  // Takes `bytes` from the budget, spilling unpinned rows of this table to disk while it is
  // short. RESOURCE_EXHAUSTED names the table, the limit and the directory when even that cannot
  // free enough; disk errors name the directory. Holds no stripe lock when called.
  absl::Status Reserve(uint64_t bytes, MemoryBudget* budget, uint64_t rows_wanted);
  // Moves up to `want` cold rows of `s` to disk; returns how many.
  uint64_t SpillFrom(Stripe* s, uint64_t want, bool hot_too, MemoryBudget* budget,
                     absl::Status* error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  // The row of `key` on disk, if any: [updates | last_step | last_ms | weights | slots].
  bool ReadSpilled(uint64_t key, std::string* value, absl::Status* error) const;
  // Frees the collectable rows (EmbeddingPolicy::Collectable) of the next slice of the disk tier.
  uint64_t SweepExpiredOnDisk(int64_t min_clock, int64_t now_ms) ABSL_LOCKS_EXCLUDED(sweep_mu_);
  std::string EncodeRow(Stripe* s, uint32_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  // Opens the disk tier's store at the first need. Errors name the table.
  absl::Status OpenStore() ABSL_LOCKS_EXCLUDED(store_mu_);
  void NoteRowLive(Stripe* s, uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  // Drops the rows for which drop(key, last_step, last_ms) (0, 0 without expiry); returns how
  // many.
  uint64_t DropIf(absl::FunctionRef<bool(uint64_t key, int64_t last_step, int64_t last_ms)> drop,
                  MemoryBudget* budget, bool include_disk = true);

  const TableInfo* info_;
  const Clock* const clock_;
  const std::string spill_path_;
  EmbeddingPolicy policy_;
  // With a disk tier: how often each key was pushed lately (TinyLFU's sketch, with its
  // doorkeeper). A row pushed lately by more than one push more often than the rows spilled
  // lately (victim_pushes_x16_, their mean) is passed over by the spilling clock's first turn;
  // a row pushed while on disk comes back into memory only when pushed lately by more than half
  // a push more often than they (else it is updated where it lies). So rows of a skewed key
  // space's long tail, touched once or twice, do not push hotter rows out of memory, and rows
  // colder than the tail (a fill's, never touched again) make way for it.
  std::unique_ptr<RecentTouches> pushes_;
  std::atomic<uint32_t> victim_pushes_x16_{0};  // Mean estimate of recent victims, times 16.
  absl::Mutex store_mu_;
  std::unique_ptr<RowStore> store_ ABSL_GUARDED_BY(store_mu_);  // Opened at the first spill.
  std::atomic<RowStore*> store_ptr_{nullptr};                      // store_, once open.
  std::atomic<uint64_t> rows_on_disk_{0};
  std::atomic<uint64_t> ram_hits_{0};
  std::atomic<uint64_t> disk_reads_{0};
  std::atomic<uint64_t> spills_{0};
  std::atomic<uint64_t> updated_on_disk_{0};
  std::atomic<uint32_t> spill_cursor_{0};
  absl::Mutex sweep_mu_;
  uint64_t disk_sweep_from_ ABSL_GUARDED_BY(sweep_mu_) = 0;  // Key the next disk sweep starts at.
  // The latest step any push was applied at (a pull's "now" for expiry in steps).
  std::atomic<int64_t> max_step_{0};
  std::atomic<uint64_t> admissions_{0};
  std::atomic<uint64_t> not_admitted_{0};
  std::atomic<uint64_t> expiries_{0};
  std::atomic<uint64_t> reads_without_row_{0};
  size_t row_floats_;
  size_t rows_per_page_;
  std::unique_ptr<Stripe[]> stripes_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_TABLE_H_
