#include "server/job.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/sharding.h"

namespace pscluster {
namespace {

std::string DName(v1::DataType t) { return std::string(DTypeName(t)); }

// Steps and clocks a caller sends: never negative, and far enough from the int64 limit that the
// step + 1 and clock - staleness the consistency rules compute cannot overflow.
constexpr int64_t kMaxStep = int64_t{1} << 62;

absl::Status CheckStep(int64_t v, absl::string_view field) {
  if (v < 0) return absl::InvalidArgumentError(absl::StrCat(field, ": ", v, " is negative"));
  if (v > kMaxStep) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", v, " is beyond the largest step, ", kMaxStep, " (2^62)"));
  }
  return absl::OkStatus();
}

bool IsFloatTransport(v1::DataType t) {
  return t == v1::DT_FLOAT32 || t == v1::DT_FLOAT16 || t == v1::DT_BFLOAT16;
}

uint64_t HashKeys(absl::Span<const uint64_t> keys) {
  uint64_t h = Mix64(keys.size());
  for (uint64_t k : keys) h = Mix64(h ^ k);
  return h;
}

uint64_t ChunkIdentity(uint64_t seq, const SliceRef& s, uint64_t offset, uint64_t n) {
  uint64_t h = Mix64(seq);
  h = Mix64(h ^ (static_cast<uint64_t>(s.table) << 1 | (s.dense ? 1 : 0)));
  h = Mix64(h ^ s.block);
  h = Mix64(h ^ offset);
  h = Mix64(h ^ s.keys_hash);
  return Mix64(h ^ n);
}

}  // namespace

Job::Job(JobConfig config, MemoryBudget* budget, const Clock* clock, DataPlaneLimits limits)
    : config_(std::move(config)),
      budget_(budget),
      clock_(clock),
      limits_(limits),
      held_(config_.num_shards, true),
      clocks_(config_.num_workers, 0),
      fences_(config_.num_workers, 0),
      left_(config_.num_workers, false),
      applied_(config_.num_workers),
      shard_bytes_(new std::atomic<uint64_t>[config_.num_shards]),
      shard_requests_(new std::atomic<uint64_t>[config_.num_shards]) {
  for (uint32_t i = 0; i < config_.num_shards; ++i) {
    shard_bytes_[i] = 0;
    shard_requests_[i] = 0;
  }
}

Job::~Job() {
  absl::MutexLock l(&state_mu_);
  for (auto& t : tables_) {
    if (t.dense) t.dense->Clear(budget_);
    if (t.sparse) t.sparse->Clear(budget_);
  }
}

// ------------------------------------------------------------------ control plane

absl::StatusOr<uint32_t> Job::AddTables(const std::vector<v1::TableSpec>& specs,
                                        const std::vector<OptimizerParams>& optimizers) {
  absl::MutexLock l(&state_mu_);
  std::vector<size_t> fresh;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto it = table_index_.find(specs[i].name());
    if (it == table_index_.end()) {
      fresh.push_back(i);
      continue;
    }
    TableInfo probe(specs[i], optimizers[i], config_.num_shards);
    if (probe.spec.SerializeAsString() != tables_[it->second].info->spec.SerializeAsString()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "tables[", i, "]: table '", specs[i].name(), "' of job '", id(),
          "' already exists with a different spec"));
    }
  }
  const size_t first_new = tables_.size();
  for (size_t i : fresh) {
    TableState t;
    t.info = std::make_unique<TableInfo>(specs[i], optimizers[i], config_.num_shards);
    if (t.info->dense()) {
      t.dense = std::make_unique<DenseTable>(t.info.get());
      absl::Status s = t.dense->SetHeldShards(held_, budget_);
      if (!s.ok()) {
        for (size_t j = first_new; j < tables_.size(); ++j) {
          if (tables_[j].dense) tables_[j].dense->Clear(budget_);
          table_index_.erase(tables_[j].info->spec.name());
        }
        tables_.resize(first_new);
        return absl::Status(s.code(), absl::StrCat("tables[", i, "]: ", s.message()));
      }
    } else {
      t.sparse = std::make_unique<SparseTable>(t.info.get(), clock_);
    }
    table_index_[specs[i].name()] = static_cast<uint32_t>(tables_.size());
    tables_.push_back(std::move(t));
  }
  return static_cast<uint32_t>(fresh.size());
}

absl::Status Job::SetShards(uint64_t epoch, std::vector<bool> held) {
  absl::MutexLock l(&state_mu_);
  if (have_map_ && epoch <= epoch_) return absl::OkStatus();
  return SetShardsLocked(epoch, std::move(held));
}

absl::Status Job::SetShards(uint64_t epoch, std::vector<bool> held, MapChange change) {
  std::vector<Waiter> waiters;
  absl::Status s = SetShardsChanging(epoch, std::move(held), std::move(change), &waiters);
  // Reads parked at the older epoch would only fail once released (their epoch is gone), and
  // an adoption may have lowered the clocks they wait for below what their own round already
  // pushed: they fail now, and their clients retry with the new map.
  for (auto& w : waiters) {
    w.ready(absl::FailedPreconditionError(absl::StrCat(
        "epoch: job '", id(), "' moved to shard-map epoch ", epoch,
        " while this read waited; refresh the shard map (current epoch ", epoch, ")")));
  }
  return s;
}

absl::Status Job::SetShardsChanging(uint64_t epoch, std::vector<bool> held, MapChange change,
                                    std::vector<Waiter>* parked) {
  absl::MutexLock l(&state_mu_);
  if (have_map_ && epoch <= epoch_) return absl::OkStatus();
  const std::vector<bool> before = held_;
  const uint64_t before_epoch = epoch_;
  absl::Status s = SetShardsLocked(epoch, std::move(held));
  if (!s.ok()) return s;
  for (const MapChange::Adoption& a : change.adopt) {
    auto r = RestoreLocked(a.copy.bytes, a.from, /*set_clocks=*/false);
    if (!r.ok()) {
      // Undo the shard change (blocks newly held go back to the initializer's values, which no
      // one has read: the epoch was never served).
      epoch_ = before_epoch;
      (void)SetShardsLocked(before_epoch, before);
      return r.status();
    }
  }
  {
    absl::MutexLock c(&clock_mu_);
    for (const MapChange::Adoption& a : change.adopt) JoinClocksLocked(a.clocks, a.applied);
    for (auto& [id, w] : waiters_) parked->push_back(std::move(w));
    waiters_.clear();
    waits_by_need_.clear();
  }
  forwarding_ = std::move(change.forwarding);
  if (change.seed) {
    auto snap = MakeCheckpointLocked(change.node_id, absl::ToUnixMillis(clock_->Now()),
                                     std::nullopt);
    if (!snap.ok()) return snap.status();
    change.seed(*snap);
  }
  return absl::OkStatus();
}

void Job::SetForwarding(std::shared_ptr<ForwardingState> forwarding) {
  absl::MutexLock l(&state_mu_);
  forwarding_ = std::move(forwarding);
}

absl::Status Job::SetShardsLocked(uint64_t epoch, std::vector<bool> held) {
  // Phase 1: allocate newly held blocks (keeping old ones), so a failure loses nothing.
  std::vector<bool> both(held.size());
  for (size_t i = 0; i < held.size(); ++i) both[i] = held[i] || held_[i];
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (!tables_[t].dense) continue;
    absl::Status s = tables_[t].dense->SetHeldShards(both, budget_);
    if (!s.ok()) {
      for (size_t u = 0; u < t; ++u) {
        if (tables_[u].dense) (void)tables_[u].dense->SetHeldShards(held_, budget_);
      }
      return s;
    }
  }
  // Phase 2: free what is no longer held.
  for (auto& t : tables_) {
    if (t.dense) (void)t.dense->SetHeldShards(held, budget_);
    if (t.sparse) t.sparse->DropUnheld(held, budget_);
  }
  held_ = std::move(held);
  epoch_ = epoch;
  have_map_ = true;
  return absl::OkStatus();
}

void Job::Declared(std::vector<v1::TableSpec>* specs,
                   std::vector<OptimizerParams>* optimizers) const {
  absl::ReaderMutexLock l(&state_mu_);
  for (const TableState& t : tables_) {
    specs->push_back(t.info->spec);
    optimizers->push_back(t.info->optimizer);
  }
}

bool Job::HoldsShard(uint32_t shard) const {
  absl::ReaderMutexLock l(&state_mu_);
  return shard < held_.size() && held_[shard];
}

uint64_t Job::epoch() const {
  absl::ReaderMutexLock l(&state_mu_);
  return epoch_;
}

absl::Status Job::CheckRequestEpoch(uint64_t epoch) const {
  absl::ReaderMutexLock l(&state_mu_);
  return CheckEpoch(epoch, "epoch");
}

void Job::Drop() {
  dropped_ = true;
  std::vector<Waiter> waiters;
  {
    absl::MutexLock l(&state_mu_);
    for (auto& t : tables_) {
      if (t.dense) t.dense->Clear(budget_);
      if (t.sparse) t.sparse->Clear(budget_);
    }
    absl::MutexLock c(&clock_mu_);
    for (auto& [id, w] : waiters_) waiters.push_back(std::move(w));
    waiters_.clear();
    waits_by_need_.clear();
    agg_.clear();
  }
  for (auto& w : waiters) {
    w.ready(absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped")));
  }
}

// ------------------------------------------------------------------ validation

absl::Status Job::CheckEpoch(uint64_t epoch, absl::string_view field) const {
  if (!have_map_) return absl::OkStatus();  // Standalone: every shard is held.
  if (epoch < epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": request epoch ", epoch, " is older than the server's epoch ", epoch_,
        " for job '", id(), "'; refresh the shard map (current epoch ", epoch_, ")"));
  }
  if (epoch > epoch_) {
    return absl::UnavailableError(absl::StrCat(
        field, ": request epoch ", epoch, " is newer than the server's epoch ", epoch_,
        " for job '", id(), "' (the map has not reached this server yet); retry"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SliceRef> Job::Resolve(const v1::Slice& slice, absl::string_view field) const {
  auto it = table_index_.find(slice.table());
  if (it == table_index_.end()) {
    return absl::NotFoundError(absl::StrCat(field, ".table: unknown table '", slice.table(),
                                            "' in job '", id(), "'"));
  }
  SliceRef s;
  s.table = it->second;
  const TableState& t = tables_[s.table];
  const TableInfo& info = *t.info;
  s.dense = info.dense();
  if (s.dense) {
    if (!slice.keys().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".keys: table '", slice.table(), "' is dense; address it by block, not keys"));
    }
    if (slice.block() >= t.dense->num_blocks()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".block: block ", slice.block(), " is outside table '", slice.table(), "' (",
          t.dense->num_blocks(), " blocks)"));
    }
    uint32_t shard = t.dense->ShardOf(slice.block());
    if (!held_[shard]) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ".block: block ", slice.block(), " of '", slice.table(), "' is on virtual shard ",
          shard, ", not held by this server at epoch ", epoch_, "; refresh the shard map"));
    }
    s.block = slice.block();
    s.elems = t.dense->BlockLen(s.block);
    return s;
  }
  const std::string& kb = slice.keys();
  if (kb.size() % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".keys: ", kb.size(), " bytes is not a whole number of uint64 keys"));
  }
  const uint64_t nkeys = kb.size() / 8;
  if (nkeys > limits_.max_keys) {
    return absl::ResourceExhaustedError(absl::StrCat(field, ".keys: ", nkeys,
                                                     " keys exceed the limit of ", limits_.max_keys,
                                                     " per slice"));
  }
  s.keys.resize(nkeys);
  if (nkeys > 0) std::memcpy(s.keys.data(), kb.data(), kb.size());
  const uint64_t space = info.spec.key_space();
  for (uint64_t k : s.keys) {
    if (space != 0 && k >= space) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".keys: key ", k,
                                                     " is outside table '", slice.table(),
                                                     "' (key_space ", space, ")"));
    }
    uint32_t shard = t.sparse->ShardOf(k);
    if (!held_[shard]) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ".keys: key ", k, " of '", slice.table(), "' is on virtual shard ", shard,
          ", not held by this server at epoch ", epoch_, "; refresh the shard map"));
    }
  }
  s.elems = nkeys * info.width;
  s.keys_hash = HashKeys(s.keys);
  return s;
}

uint32_t Job::ShardOfSlice(const SliceRef& s) const {
  const TableState& t = tables_[s.table];
  if (s.dense) return t.dense->ShardOf(s.block);
  return s.keys.empty() ? 0 : t.sparse->ShardOf(s.keys[0]);
}

void Job::CountShard(uint32_t shard, uint64_t bytes) {
  if (shard >= config_.num_shards) return;
  shard_bytes_[shard].fetch_add(bytes, std::memory_order_relaxed);
  shard_requests_[shard].fetch_add(1, std::memory_order_relaxed);
}

uint32_t Job::table_width(uint32_t table) const {
  absl::ReaderMutexLock l(&state_mu_);
  return tables_[table].info->dense() ? 1 : tables_[table].info->width;
}

// ------------------------------------------------------------------ push

absl::StatusOr<PushResult> Job::Push(const v1::PushChunk& chunk, const Payload& values,
                                     absl::FunctionRef<std::string()> node_id) {
  if (dropped_) {
    return absl::NotFoundError(absl::StrCat("tag.job_id: job '", id(), "' was dropped"));
  }
  std::vector<std::function<void(absl::Status)>> ready;
  absl::StatusOr<PushResult> r;
  int64_t hold = -1;
  {
    absl::ReaderMutexLock l(&state_mu_);
    r = PushLocked(chunk, values, &ready, &hold);
    if (r.ok() && forwarding_ != nullptr) {
      forwarding_->Begin();
      r->forwarding = forwarding_;
    }
  }
  if (hold >= 0) {
    // No read at the new clock has been served yet, so no worker can have pushed a later step:
    // the snapshot holds exactly the steps up to `hold` (under BSP).
    auto snap = MakeCheckpoint(node_id(), absl::ToUnixMillis(clock_->Now()), hold);
    if (snap.ok() && r.ok()) r->checkpoint = std::make_shared<const Snapshot>(std::move(*snap));
    ReleaseHeld(hold, &ready);
  }
  for (auto& f : ready) f(absl::OkStatus());
  return r;
}

absl::StatusOr<PushResult> Job::PushLocked(const v1::PushChunk& chunk, const Payload& values,
                                           std::vector<std::function<void(absl::Status)>>* ready,
                                           int64_t* hold) {
  if (sealed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", id(), "': this copy was taken over by its server and takes no more updates"));
  }
  absl::Status st = CheckEpoch(chunk.epoch(), "epoch");
  if (!st.ok()) return st;
  const v1::Tag& tag = chunk.tag();
  if (tag.worker() >= config_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("tag.worker: rank ", tag.worker(),
                                                   " is outside job '", id(), "' (",
                                                   config_.num_workers, " workers)"));
  }
  st = CheckStep(tag.step(), "tag.step");
  if (!st.ok()) return st;
  st = CheckAttempt(tag.worker(), tag.attempt(), "tag.attempt");
  if (!st.ok()) return st;
  const v1::DataType dtype = TransportType(chunk.dtype());
  if (!IsFloatTransport(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype: values must be float32, float16 or bfloat16, got ", DName(dtype),
        " (", static_cast<int>(chunk.dtype()), ")"));
  }
  if (values.size() > limits_.max_chunk_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "values: ", values.size(), " bytes exceed the limit of ", limits_.max_chunk_bytes,
        " bytes per chunk; split tensors into chunks of about 4 MiB"));
  }
  if (chunk.pull_after()) {
    st = CheckStep(chunk.pull_clock(), "pull_clock");
    if (!st.ok()) return st;
  }
  const bool has_slice = !chunk.slice().table().empty();
  if (!values.empty() || chunk.end_of_step()) {
    // A worker pushes its current step (its clock) or, at most, the next one. A push further
    // ahead would move the clock past steps the worker has not pushed yet, and its real pushes
    // of those steps would then be taken for duplicates: refused in every consistency mode.
    // (A chunk with no values that ends no step only asks for a pull: its step is the pull's.)
    absl::MutexLock c(&clock_mu_);
    const int64_t clock = clocks_[tag.worker()];
    if (tag.step() > clock + 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tag.step: step ", tag.step(), " is more than one step ahead of rank ", tag.worker(),
          "'s clock ", clock, " in job '", id(), "' (it has completed steps below ", clock,
          "); push step ", clock, " first"));
    }
  }
  SliceRef s;
  uint64_t n = 0;
  if (!has_slice) {
    if (!values.empty() || !chunk.indices().empty() || chunk.pull_after()) {
      return absl::InvalidArgumentError("slice.table: values or pull_after without a table");
    }
  } else {
    auto r = Resolve(chunk.slice(), "slice");
    if (!r.ok()) return r.status();
    s = std::move(*r);
    const size_t es = DTypeSize(dtype);
    if (values.size() % es != 0) {
      return absl::InvalidArgumentError(absl::StrCat("values: ", values.size(),
                                                     " bytes is not a whole number of ",
                                                     DName(dtype), " elements"));
    }
    n = values.size() / es;
    const uint32_t width = s.dense ? 1 : tables_[s.table].info->width;
    if (!chunk.indices().empty()) {
      if (!s.dense) {
        return absl::InvalidArgumentError(
            "indices: top-k indices apply to dense blocks; sparse pushes list their rows in keys");
      }
      if (chunk.indices().size() % 4 != 0 || chunk.indices().size() / 4 != n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "indices: ", chunk.indices().size(), " bytes do not hold one uint32 per value (",
            n, " values)"));
      }
      if (chunk.offset() != 0) {
        return absl::InvalidArgumentError("offset: must be 0 for a top-k push");
      }
      for (uint64_t i = 0; i < n; ++i) {
        uint32_t idx;
        std::memcpy(&idx, chunk.indices().data() + 4 * i, 4);
        if (idx >= s.elems) {
          return absl::InvalidArgumentError(absl::StrCat("indices: index ", idx,
                                                         " is outside block ", s.block, " (",
                                                         s.elems, " elements)"));
        }
      }
    } else {
      if (chunk.offset() > s.elems || n > s.elems - chunk.offset()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "values: ", n, " elements at offset ", chunk.offset(), " overrun the slice of '",
            chunk.slice().table(), "' (", s.elems, " elements)"));
      }
      if (chunk.offset() % width != 0 || n % width != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "values: offset ", chunk.offset(), " and ", n,
            " elements must be whole rows of width ", width));
      }
    }
  }

  PushResult result;
  const uint32_t w = tag.worker();
  uint64_t identity = has_slice ? ChunkIdentity(tag.seq(), s, chunk.offset(), n) : 0;
  if (n > 0) {
    absl::MutexLock c(&clock_mu_);
    if (tag.step() < clocks_[w] || !applied_[w][tag.step()].insert(identity).second) {
      result.duplicate = true;
    }
  }
  if (n > 0 && !result.duplicate) {
    absl::Status a = config_.consistency.aggregate() ? Aggregate(s, chunk, values, dtype, n)
                                                     : ApplyValues(s, chunk, values, dtype, n,
                                                                   &result.row_decisions);
    if (!a.ok()) {
      absl::MutexLock c(&clock_mu_);
      applied_[w][tag.step()].erase(identity);
      return a;
    }
    result.applied = true;
    CountShard(ShardOfSlice(s), values.size());
  }
  if (has_slice) result.shard = ShardOfSlice(s);
  bool advanced = false;
  {
    absl::MutexLock c(&clock_mu_);
    // Fenced while its values were applied (they stay, recorded under their tag, so that the
    // newer task's copy of this chunk is a duplicate): the step does not complete for it.
    absl::Status fenced = CheckAttemptLocked(w, tag.attempt(), "tag.attempt");
    if (!fenced.ok()) return fenced;
    if (chunk.end_of_step() && clocks_[w] < tag.step() + 1) {
      int64_t before = MinClockLocked();
      clocks_[w] = tag.step() + 1;
      // The record of the step just completed stays one step longer: should a backup's copy
      // take over with that step missing there, the worker pushes it again and what was
      // applied here must be a duplicate (AdoptReplica).
      auto& steps = applied_[w];
      steps.erase(steps.begin(), steps.lower_bound(clocks_[w] - 1));
      advanced = MinClockLocked() != before;
    }
    result.clock = clocks_[w];
  }
  if (advanced) AfterAdvance(ready, hold);
  return result;
}

absl::Status Job::ApplyValues(const SliceRef& s, const v1::PushChunk& chunk,
                              const Payload& values, v1::DataType dtype, uint64_t n,
                              std::string* row_decisions) {
  const TableState& t = tables_[s.table];
  if (s.dense) {
    DenseBlock* b = t.dense->block(s.block);
    if (chunk.indices().empty()) {
      t.dense->ApplyPayload(b, chunk.offset(), n, values, dtype, chunk.tag().step());
      return absl::OkStatus();
    }
    std::vector<float> sparse_vals(n), g(s.elems, 0.f);
    values.DecodeFloats(dtype, 0, n, sparse_vals.data());
    for (uint64_t i = 0; i < n; ++i) {
      uint32_t idx;
      std::memcpy(&idx, chunk.indices().data() + 4 * i, 4);
      g[idx] += sparse_vals[i];
    }
    t.dense->Apply(b, 0, s.elems,
                   [&](size_t first, size_t k, float* out) {
                     std::memcpy(out, g.data() + first, k * sizeof(float));
                   },
                   chunk.tag().step());
    return absl::OkStatus();
  }
  const uint32_t width = t.info->width;
  absl::Span<const uint64_t> keys(s.keys.data() + chunk.offset() / width, n / width);
  // Duplicate keys add their gradients: sum them first so each row gets one update.
  absl::flat_hash_map<uint64_t, uint32_t> first_pos;
  first_pos.reserve(keys.size());
  bool dups = false;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!first_pos.emplace(keys[i], static_cast<uint32_t>(i)).second) dups = true;
  }
  // Admission and expiry: a copy does what its primary did (PushChunk.row_decisions).
  SparseTable::Decisions decisions;
  decisions.follow = chunk.row_decisions();
  if (!dups) {
    absl::Status st = t.sparse->Apply(
        keys,
        [&](size_t first, size_t k, float* out) { values.DecodeFloats(dtype, first, k, out); },
        budget_, chunk.tag().step(), &decisions);
    *row_decisions = std::move(decisions.made);
    return st;
  }
  std::vector<float> all(n);
  values.DecodeFloats(dtype, 0, n, all.data());
  std::vector<uint64_t> uniq;
  std::vector<float> sum;
  absl::flat_hash_map<uint64_t, uint32_t> slot;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, fresh] = slot.emplace(keys[i], static_cast<uint32_t>(uniq.size()));
    if (fresh) {
      uniq.push_back(keys[i]);
      sum.insert(sum.end(), all.begin() + i * width, all.begin() + (i + 1) * width);
    } else {
      float* dst = sum.data() + static_cast<size_t>(it->second) * width;
      for (uint32_t j = 0; j < width; ++j) dst[j] += all[i * width + j];
    }
  }
  absl::Status st = t.sparse->Apply(
      uniq,
      [&](size_t first, size_t k, float* out) {
        std::memcpy(out, sum.data() + first, k * sizeof(float));
      },
      budget_, chunk.tag().step(), &decisions);
  *row_decisions = std::move(decisions.made);
  return st;
}

uint64_t Job::CollectExpired() {
  if (dropped_) return 0;
  absl::ReaderMutexLock l(&state_mu_);
  const int64_t min = min_clock();
  uint64_t n = 0;
  for (const auto& t : tables_) {
    if (t.sparse) n += t.sparse->CollectExpired(min, budget_);
  }
  return n;
}

absl::Status Job::Aggregate(const SliceRef& s, const v1::PushChunk& chunk, const Payload& values,
                            v1::DataType dtype, uint64_t n) {
  if (!s.dense) {
    // The step's rows are made now, all or nothing, so that applying the step once every worker
    // ended it never needs memory that may have run out by then: a push that cannot have its
    // rows is refused here, with nothing aggregated.
    const uint32_t width = tables_[s.table].info->width;
    absl::Span<const uint64_t> keys(s.keys.data() + chunk.offset() / width, n / width);
    absl::Status made =
        tables_[s.table].sparse->VisitRows(keys, budget_, [](size_t, float*, int64_t*) {});
    if (!made.ok()) return made;
  }
  AggStep* step;
  {
    absl::MutexLock c(&clock_mu_);
    auto& slot = agg_[chunk.tag().step()];
    if (!slot) slot = std::make_unique<AggStep>();
    step = slot.get();
  }
  std::vector<float> g(n);
  values.DecodeFloats(dtype, 0, n, g.data());
  absl::MutexLock a(&step->mu);
  if (s.dense) {
    auto& sum = step->dense[{s.table, s.block}];
    if (sum.empty()) sum.assign(s.elems, 0.f);
    if (chunk.indices().empty()) {
      float* dst = sum.data() + chunk.offset();
      for (uint64_t i = 0; i < n; ++i) dst[i] += g[i];
    } else {
      for (uint64_t i = 0; i < n; ++i) {
        uint32_t idx;
        std::memcpy(&idx, chunk.indices().data() + 4 * i, 4);
        sum[idx] += g[i];
      }
    }
    return absl::OkStatus();
  }
  const uint32_t width = tables_[s.table].info->width;
  auto& rows = step->sparse[s.table];
  const uint64_t first_row = chunk.offset() / width;
  for (uint64_t r = 0; r < n / width; ++r) {
    auto& row = rows[s.keys[first_row + r]];
    if (row.empty()) row.assign(width, 0.f);
    for (uint32_t j = 0; j < width; ++j) row[j] += g[r * width + j];
  }
  return absl::OkStatus();
}

int64_t Job::MinClockLocked() const {
  int64_t m = std::numeric_limits<int64_t>::max();
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (!left_[w]) m = std::min(m, clocks_[w]);
  }
  return m == std::numeric_limits<int64_t>::max() ? 0 : m;
}

int64_t Job::min_clock() const {
  absl::MutexLock c(&clock_mu_);
  return MinClockLocked();
}

void Job::AfterAdvance(std::vector<std::function<void(absl::Status)>>* ready, int64_t* hold) {
  {
    absl::MutexLock a(&advance_mu_);
    int64_t min;
    std::vector<std::pair<int64_t, std::unique_ptr<AggStep>>> steps;
    {
      absl::MutexLock c(&clock_mu_);
      min = MinClockLocked();
      while (!agg_.empty() && agg_.begin()->first < min) {
        steps.emplace_back(agg_.begin()->first, std::move(agg_.begin()->second));
        agg_.erase(agg_.begin());
      }
    }
    for (auto& [step_no, step] : steps) {
      absl::MutexLock sl(&step->mu);
      for (auto& [key, sum] : step->dense) {
        const TableState& t = tables_[key.first];
        DenseBlock* b = t.dense->block(key.second);
        if (b == nullptr) continue;  // Shard moved away meanwhile.
        t.dense->Apply(b, 0, sum.size(),
                       [&](size_t first, size_t k, float* out) {
                         std::memcpy(out, sum.data() + first, k * sizeof(float));
                       },
                       step_no);
      }
      for (auto& [table, rows] : step->sparse) {
        const uint32_t width = tables_[table].info->width;
        std::vector<uint64_t> keys;
        std::vector<float> g;
        keys.reserve(rows.size());
        g.reserve(rows.size() * width);
        for (auto& [k, row] : rows) {
          keys.push_back(k);
          g.insert(g.end(), row.begin(), row.end());
        }
        // The rows were made when their pushes were aggregated (Aggregate), so this needs no
        // new memory unless a shard moved away and back meanwhile; then what cannot be applied
        // is named in the log.
        absl::Status applied = tables_[table].sparse->Apply(
            keys,
            [&](size_t first, size_t k, float* out) {
              std::memcpy(out, g.data() + first, k * sizeof(float));
            },
            budget_, step_no);
        if (!applied.ok()) {
          Logger("server")->error("job '{}': aggregated step {} of table '{}' not applied: {}",
                                  id(), step_no, tables_[table].info->spec.name(), applied);
        }
      }
    }
    absl::MutexLock c(&clock_mu_);
    const int64_t every = config_.checkpoint_every_steps;
    // Without a caller to take it (a worker leaving), a checkpoint falling due waits for the
    // next advance.
    if (every > 0 && hold != nullptr && min / every > checkpointed_step_ / every) {
      checkpointed_step_ = min;
      *hold = min;  // Reads at `min` wait for the snapshot.
      return;
    }
    released_min_ = std::max(released_min_, min);
    ReleaseReadersLocked(ready);
  }
}

void Job::ReleaseHeld(int64_t min, std::vector<std::function<void(absl::Status)>>* ready) {
  absl::MutexLock c(&clock_mu_);
  released_min_ = std::max(released_min_, min);
  ReleaseReadersLocked(ready);
}

void Job::ReleaseReadersLocked(std::vector<std::function<void(absl::Status)>>* ready) {
  while (!waits_by_need_.empty() && waits_by_need_.begin()->first <= released_min_) {
    auto it = waiters_.find(waits_by_need_.begin()->second);
    if (it != waiters_.end()) {
      ready->push_back(std::move(it->second.ready));
      waiters_.erase(it);
    }
    waits_by_need_.erase(waits_by_need_.begin());
  }
}

// ------------------------------------------------------------------ reads

absl::StatusOr<SliceRef> Job::ResolveForRead(const v1::Slice& slice, uint64_t epoch,
                                             absl::string_view field) const {
  if (dropped_) return absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped"));
  absl::ReaderMutexLock l(&state_mu_);
  absl::Status st = CheckEpoch(epoch, "epoch");
  if (!st.ok()) return st;
  return Resolve(slice, field);
}

absl::Status Job::CheckReader(uint32_t worker, uint32_t attempt, int64_t clock,
                              v1::DataType dtype, absl::string_view worker_field,
                              absl::string_view dtype_field) const {
  if (worker >= config_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(worker_field, ": rank ", worker,
                                                   " is outside job '", id(), "' (",
                                                   config_.num_workers, " workers)"));
  }
  absl::Status st = CheckAttempt(worker, attempt, "attempt");
  if (!st.ok()) return st;
  st = CheckStep(clock, "clock");
  if (!st.ok()) return st;
  if (!IsFloatTransport(TransportType(dtype))) {
    return absl::InvalidArgumentError(absl::StrCat(
        dtype_field, ": pulls return float32, float16 or bfloat16, not ", DName(dtype), " (",
        static_cast<int>(dtype), ")"));
  }
  return absl::OkStatus();
}

std::pair<int64_t, uint32_t> Job::Fence(uint32_t worker, uint32_t attempt) {
  absl::MutexLock c(&clock_mu_);
  if (worker >= fences_.size()) return {-1, 0};
  fences_[worker] = std::max(fences_[worker], attempt);
  return {clocks_[worker], fences_[worker]};
}

void Job::FenceAll(uint32_t attempt) {
  absl::MutexLock c(&clock_mu_);
  for (uint32_t& f : fences_) f = std::max(f, attempt);
}

absl::StatusOr<int64_t> Job::Leave(uint32_t worker) {
  int64_t clock;
  {
    absl::MutexLock c(&clock_mu_);
    if (worker >= left_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("worker: rank ", worker, " is outside job '",
                                                     id(), "' (", left_.size(), " workers)"));
    }
    clock = clocks_[worker];
    if (left_[worker]) return clock;
    size_t staying = 0;
    for (bool l : left_) staying += l ? 0 : 1;
    if (staying <= 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker: rank ", worker, " is the last rank of job '", id(), "' and cannot leave it"));
    }
    left_[worker] = true;
    fences_[worker] = std::numeric_limits<uint32_t>::max();
    applied_[worker].clear();
  }
  std::vector<std::function<void(absl::Status)>> ready;
  {
    absl::ReaderMutexLock l(&state_mu_);
    AfterAdvance(&ready, nullptr);
  }
  for (auto& f : ready) f(absl::OkStatus());
  return clock;
}

absl::StatusOr<int64_t> Job::Rejoin(uint32_t worker, uint32_t attempt) {
  absl::MutexLock c(&clock_mu_);
  if (worker >= left_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("worker: rank ", worker, " is outside job '",
                                                   id(), "' (", left_.size(), " workers)"));
  }
  if (!left_[worker]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rejoin: rank ", worker, " of job '", id(), "' has not left it"));
  }
  const int64_t clock = MinClockLocked();  // Of the others: this one is still out.
  left_[worker] = false;
  clocks_[worker] = clock;
  applied_[worker].clear();
  fences_[worker] = attempt;
  return clock;
}

bool Job::HasLeft(uint32_t worker) const {
  absl::MutexLock c(&clock_mu_);
  return worker < left_.size() && left_[worker];
}

std::vector<uint32_t> Job::LeftWorkers() const {
  absl::MutexLock c(&clock_mu_);
  std::vector<uint32_t> out;
  for (uint32_t w = 0; w < left_.size(); ++w) {
    if (left_[w]) out.push_back(w);
  }
  return out;
}

absl::Status Job::CheckAttempt(uint32_t worker, uint32_t attempt,
                               absl::string_view field) const {
  absl::MutexLock c(&clock_mu_);
  return CheckAttemptLocked(worker, attempt, field);
}

absl::Status Job::CheckAttemptLocked(uint32_t worker, uint32_t attempt,
                                     absl::string_view field) const {
  if (worker >= fences_.size() || attempt >= fences_[worker]) return absl::OkStatus();
  if (left_[worker]) {
    return absl::AbortedError(absl::StrCat(field, ": rank ", worker, " has left job '", id(),
                                           "' (its worker was lost); this task must stop"));
  }
  return absl::AbortedError(absl::StrCat(
      field, ": rank ", worker, " of job '", id(), "' was handed to a newer task (attempt ",
      fences_[worker], "); this task (attempt ", attempt, ") was replaced and must stop"));
}

int64_t Job::NeedFor(int64_t clock) const {
  switch (config_.consistency.mode()) {
    case v1::ConsistencySpec::ASP:
      return std::numeric_limits<int64_t>::min();
    case v1::ConsistencySpec::SSP:
      return clock - static_cast<int64_t>(config_.consistency.staleness());
    default:
      return clock;
  }
}

bool Job::WhenReadable(int64_t clock, std::function<void(absl::Status)> ready,
                       uint64_t* wait_id) {
  const int64_t need = NeedFor(clock);
  absl::MutexLock c(&clock_mu_);
  if (need <= released_min_ || dropped_) return true;
  uint64_t id = next_wait_id_++;
  waiters_[id] = Waiter{need, std::move(ready)};
  waits_by_need_.emplace(need, id);
  *wait_id = id;
  return false;
}

bool Job::ReadableAfterOwnPush(int64_t clock, uint32_t worker, int64_t step,
                               int64_t* min_clock) {
  if (config_.consistency.aggregate()) return false;
  const int64_t need = NeedFor(clock);
  if (step + 1 < need) return false;  // The reader's own earlier steps would not be in.
  absl::MutexLock c(&clock_mu_);
  if (worker >= clocks_.size() || dropped_) return false;
  int64_t others = std::numeric_limits<int64_t>::max();
  for (uint32_t w = 0; w < clocks_.size(); ++w) {
    if (w != worker && !left_[w]) others = std::min(others, clocks_[w]);
  }
  if (others < need) return false;
  *min_clock = std::min(others, std::max(clocks_[worker], step + 1));
  return true;
}

bool Job::CancelWait(uint64_t wait_id) {
  absl::MutexLock c(&clock_mu_);
  return waiters_.erase(wait_id) > 0;
}

absl::Status Job::Read(const SliceRef& s, uint64_t epoch, uint64_t first, uint64_t n,
                       v1::DataType dtype, char* out) {
  if (dropped_) return absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped"));
  absl::ReaderMutexLock l(&state_mu_);
  absl::Status st = CheckEpoch(epoch, "epoch");
  if (!st.ok()) return st;
  const TableState& t = tables_[s.table];
  if (s.dense) {
    DenseBlock* b = t.dense->block(s.block);
    if (b == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "slice.block: block ", s.block, " is no longer held here (epoch ", epoch_, ")"));
    }
    t.dense->Read(b, first, n, TransportType(dtype), out);
    CountShard(t.dense->ShardOf(s.block), n * DTypeSize(TransportType(dtype)));
    return absl::OkStatus();
  }
  const uint32_t width = t.info->width;
  absl::Span<const uint64_t> keys(s.keys.data() + first / width, n / width);
  t.sparse->Read(keys, TransportType(dtype), out);
  CountShard(ShardOfSlice(s), n * DTypeSize(TransportType(dtype)));
  return absl::OkStatus();
}

absl::StatusOr<LentBytes> Job::Lend(const SliceRef& s, uint64_t epoch, uint64_t first,
                                    uint64_t n) {
  if (dropped_) return absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped"));
  absl::ReaderMutexLock l(&state_mu_);
  absl::Status st = CheckEpoch(epoch, "epoch");
  if (!st.ok()) return st;
  const TableState& t = tables_[s.table];
  DenseBlock* b = s.dense ? t.dense->block(s.block) : nullptr;
  if (b == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slice.block: block ", s.block, " is no longer held here (epoch ", epoch_, ")"));
  }
  CountShard(t.dense->ShardOf(s.block), n * sizeof(float));
  return t.dense->Lend(b, first, n);
}

int64_t Job::RecordServedPull(int64_t reader_clock, int64_t min) {
  absl::MutexLock c(&clock_mu_);
  if (min < 0) min = MinClockLocked();
  int64_t stale = std::max<int64_t>(0, reader_clock - min);
  staleness_sum_ += static_cast<double>(stale);
  ++staleness_count_;
  staleness_max_ = std::max(staleness_max_, stale);
  return min;
}

// ------------------------------------------------------------------ status

void Job::FillStatus(v1::JobOnServer* out) const {
  out->set_job_id(id());
  *out->mutable_consistency() = config_.consistency;
  {
    absl::ReaderMutexLock l(&state_mu_);
    out->set_epoch(epoch_);
    for (uint32_t i = 0; i < held_.size(); ++i) {
      if (held_[i]) out->add_shards(i);
    }
    for (const auto& t : tables_) {
      auto* ts = out->add_tables();
      ts->set_name(t.info->spec.name());
      ts->set_kind(t.info->spec.kind());
      if (t.dense) {
        ts->set_rows(t.dense->blocks_held());
        ts->set_bytes(t.dense->bytes_held());
        ts->set_elements(t.dense->elements_held());
      } else {
        uint64_t rows = t.sparse->rows();
        ts->set_rows(rows);
        ts->set_bytes(t.sparse->bytes_held());
        ts->set_elements(rows * t.info->width);
        const SparseTable::PolicyCounts pc = t.sparse->policy_counts();
        ts->set_admissions(pc.admissions);
        ts->set_pushes_not_admitted(pc.not_admitted);
        ts->set_expiries(pc.expiries);
        ts->set_reads_without_row(pc.reads_without_row);
        ts->set_sketch_bytes(pc.sketch_bytes);
      }
    }
  }
  absl::MutexLock c(&clock_mu_);
  int64_t max_clock = 0;
  for (uint32_t w = 0; w < clocks_.size(); ++w) {
    auto* wc = out->add_clocks();
    wc->set_worker(w);
    wc->set_clock(clocks_[w]);
    max_clock = std::max(max_clock, clocks_[w]);
    if (left_[w]) out->add_left_workers(w);
  }
  out->set_min_clock(MinClockLocked());
  out->set_max_clock(max_clock);
  out->set_mean_staleness(staleness_count_ ? staleness_sum_ / staleness_count_ : 0.0);
  out->set_max_staleness(staleness_max_);
  out->set_waiting_pulls(static_cast<uint32_t>(waiters_.size()));
  int64_t max_need = std::numeric_limits<int64_t>::min();
  for (const auto& [id, w] : waiters_) max_need = std::max(max_need, w.need);
  if (!waiters_.empty()) {
    for (uint32_t w = 0; w < clocks_.size(); ++w) {
      if (clocks_[w] < max_need && !left_[w]) out->add_waiting_for(w);
    }
  }
  out->set_checkpoint_age_sec(last_checkpoint_time_ == absl::InfinitePast()
                                  ? -1.0
                                  : absl::ToDoubleSeconds(clock_->Now() - last_checkpoint_time_));
  out->set_last_checkpoint(last_checkpoint_);
}

void Job::TakeShardLoads(double window_sec, std::vector<v1::ShardLoad>* out) {
  if (window_sec <= 0) window_sec = 1;
  for (uint32_t s = 0; s < config_.num_shards; ++s) {
    uint64_t bytes = shard_bytes_[s].exchange(0, std::memory_order_relaxed);
    uint64_t reqs = shard_requests_[s].exchange(0, std::memory_order_relaxed);
    if (bytes == 0 && reqs == 0) continue;
    v1::ShardLoad sl;
    sl.set_job_id(id());
    sl.set_shard(s);
    sl.mutable_load()->set_bytes_per_sec(static_cast<double>(bytes) / window_sec);
    sl.mutable_load()->set_requests_per_sec(static_cast<double>(reqs) / window_sec);
    out->push_back(std::move(sl));
  }
}

}  // namespace pscluster
