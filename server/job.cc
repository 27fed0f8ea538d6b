// Job: its tables, shard map and epochs, request resolution, and its status. The push path is in
// job_push.cc, the clocks and the consistency gate (reads, fences, leaving) in job_clocks.cc,
// checkpoints in job_checkpoint.cc.
#include "server/job.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/sharding.h"
#include "server/validate.h"

namespace pscluster {
namespace {

uint64_t HashKeys(absl::Span<const uint64_t> keys) {
  uint64_t h = Mix64(keys.size());
  for (uint64_t k : keys) h = Mix64(h ^ k);
  return h;
}

}  // namespace

Job::Job(JobConfig config, MemoryBudget* budget, const Clock* clock, DataPlaneLimits limits)
    : config_(std::move(config)),
      budget_(budget),
      clock_(clock),
      limits_(limits),
      held_(config_.num_shards, true),
      clocks_(config_.job_id, config_.num_workers),
      applied_(config_.num_workers),
      gate_(config_.consistency),
      pull_views_(budget),
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
      std::string spill;
      if (!config_.spill_dir.empty() && !config_.consistency.aggregate()) {
        // One directory per table of this Job object (a server may hold a job's primaries and
        // copies of other servers' shards, each a Job of its own).
        spill = absl::StrCat(config_.spill_dir, "/", config_.job_id, ".", getpid(), ".",
                             absl::Hex(reinterpret_cast<uintptr_t>(this)), ".",
                             absl::Hex(t.info->hash));
      }
      t.sparse = std::make_unique<SparseTable>(t.info.get(), clock_, std::move(spill));
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
  std::vector<ReadGate::Callback> waiters;
  absl::Status s = SetShardsChanging(epoch, std::move(held), std::move(change), &waiters);
  // Reads parked at the older epoch would only fail once released (their epoch is gone), and
  // an adoption may have lowered the clocks they wait for below what their own round already
  // pushed: they fail now, and their clients retry with the new map.
  for (auto& ready : waiters) {
    ready(absl::FailedPreconditionError(absl::StrCat(
        "epoch: job '", id(), "' moved to shard-map epoch ", epoch,
        " while this read waited; refresh the shard map (current epoch ", epoch, ")")));
  }
  return s;
}

absl::Status Job::SetShardsChanging(uint64_t epoch, std::vector<bool> held, MapChange change,
                                    std::vector<ReadGate::Callback>* parked) {
  absl::MutexLock l(&state_mu_);
  if (have_map_ && epoch <= epoch_) return absl::OkStatus();
  const std::vector<bool> before = held_;
  const uint64_t before_epoch = epoch_;
  absl::Status s = SetShardsLocked(epoch, std::move(held));
  if (!s.ok()) return s;
  for (const MapChange::Adoption& a : change.adopt) {
    auto r = RestoreLocked(*SourceOf(a.copy), a.from, /*set_clocks=*/false);
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
    *parked = gate_.TakeAll();
  }
  forwarding_ = std::move(change.forwarding);
  if (change.seed) {
    auto snap = MakeCopyLocked(change.node_id, absl::ToUnixMillis(clock_->Now()),
                               change.seed_shards.empty() ? nullptr : &change.seed_shards);
    if (!snap.ok()) return snap.status();
    change.seed(std::move(*snap));
  }
  if (change.clocks) {
    ClockState state;
    {
      absl::MutexLock c(&clock_mu_);
      state = ClockState{clocks_.clocks(), applied_.all(), clocks_.left()};
    }
    change.clocks(state);
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
  // What workers hold of blocks that moved away is of no use here any more.
  pull_views_.DropUnless([this](uint32_t table, uint64_t block)
                             ABSL_NO_THREAD_SAFETY_ANALYSIS {  // state_mu_ is held.
                               return table < tables_.size() && tables_[table].dense &&
                                      tables_[table].dense->block(block) != nullptr;
                             });
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
  std::vector<ReadGate::Callback> waiters;
  {
    absl::MutexLock l(&state_mu_);
    for (auto& t : tables_) {
      if (t.dense) t.dense->Clear(budget_);
      if (t.sparse) t.sparse->Clear(budget_);
    }
    absl::MutexLock c(&clock_mu_);
    waiters = gate_.TakeAll();
    agg_.Clear();
  }
  for (auto& ready : waiters) {
    ready(absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped")));
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
      *ts->mutable_spec() = t.info->spec;
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
        ts->set_rows_on_disk(pc.rows_on_disk);
        ts->set_ram_hits(pc.ram_hits);
        ts->set_disk_reads(pc.disk_reads);
        ts->set_spills(pc.spills);
        ts->set_updated_on_disk(pc.updated_on_disk);
      }
    }
  }
  absl::MutexLock c(&clock_mu_);
  for (uint32_t w = 0; w < clocks_.size(); ++w) {
    auto* wc = out->add_clocks();
    wc->set_worker(w);
    wc->set_clock(clocks_.clock(w));
    if (clocks_.HasLeft(w)) out->add_left_workers(w);
  }
  out->set_min_clock(clocks_.Min());
  out->set_max_clock(clocks_.Max());
  out->set_mean_staleness(gate_.mean_staleness());
  out->set_max_staleness(gate_.max_staleness());
  out->set_waiting_pulls(static_cast<uint32_t>(gate_.parked()));
  if (gate_.parked() > 0) {
    const int64_t max_need = gate_.MaxParkedNeed();
    for (uint32_t w = 0; w < clocks_.size(); ++w) {
      if (clocks_.clock(w) < max_need && !clocks_.HasLeft(w)) out->add_waiting_for(w);
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
