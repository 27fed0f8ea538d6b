// Job's clocks and its consistency gate (BSP/SSP/ASP): the slowest rank's clock, when a read at
// a clock may be served, fences of old attempts, ranks leaving and rejoining, and the reads.
#include "server/job.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/sharding.h"
#include "server/validate.h"

namespace pscluster {

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
      std::vector<std::vector<float>> freed;
      for (auto& [key, sum] : step->dense) freed.push_back(std::move(sum));
      if (!freed.empty()) {
        absl::MutexLock l(&agg_spare_mu_);
        const size_t keep = 2 * freed.size();
        for (auto& f : freed) agg_spare_.push_back(std::move(f));
        if (agg_spare_.size() > keep) {
          agg_spare_.erase(agg_spare_.begin(), agg_spare_.end() - keep);  // The oldest go.
        }
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
        dtype_field, ": pulls return float32, float16 or bfloat16, not ",
        std::string(DTypeName(dtype)), " (", static_cast<int>(dtype), ")"));
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

}  // namespace pscluster
