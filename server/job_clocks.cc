// Job's side of its clocks (WorkerClocks) and its read gate (ReadGate): a clock advance applying
// the finished aggregate steps and releasing parked reads, fences of old attempts, ranks leaving
// and rejoining, and the reads themselves.
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

int64_t Job::min_clock() const {
  absl::MutexLock c(&clock_mu_);
  return clocks_.Min();
}

void Job::ApplyAggregated(int64_t step_no, StepAggregator::Step* step) {
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
    // The rows were made when their pushes were aggregated (Aggregate), so this needs no new
    // memory unless a shard moved away and back meanwhile; then what cannot be applied is
    // named in the log.
    absl::Status applied = tables_[table].sparse->Apply(
        keys,
        [&](size_t first, size_t k, float* out) {
          std::memcpy(out, g.data() + first, k * sizeof(float));
        },
        budget_, step_no);
    if (!applied.ok()) {
      Logger("server")->error("job '{}': aggregated step {} of table '{}' not applied: {}", id(),
                              step_no, tables_[table].info->spec.name(), applied);
    }
  }
}

void Job::AfterAdvance(std::vector<ReadGate::Callback>* ready, int64_t* hold) {
  absl::MutexLock a(&advance_mu_);
  int64_t min;
  std::vector<std::pair<int64_t, std::shared_ptr<StepAggregator::Step>>> steps;
  {
    absl::MutexLock c(&clock_mu_);
    min = clocks_.Min();
    steps = agg_.TakeBefore(min);
  }
  for (auto& [step_no, step] : steps) {
    ApplyAggregated(step_no, step.get());
    agg_.Recycle(step.get());
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
  gate_.Release(min, ready);
}

void Job::ReleaseHeld(int64_t min, std::vector<ReadGate::Callback>* ready) {
  absl::MutexLock c(&clock_mu_);
  gate_.Release(min, ready);
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
  return clocks_.Fence(worker, attempt);
}

void Job::FenceAll(uint32_t attempt) {
  absl::MutexLock c(&clock_mu_);
  clocks_.FenceAll(attempt);
}

absl::StatusOr<int64_t> Job::Leave(uint32_t worker) {
  absl::StatusOr<int64_t> clock;
  {
    absl::MutexLock c(&clock_mu_);
    bool newly = false;
    clock = clocks_.Leave(worker, &newly);
    if (!clock.ok() || !newly) return clock;
    applied_.Clear(worker);
  }
  pull_views_.DropWorker(worker);  // It pulls no more (a rejoining task starts whole again).
  std::vector<ReadGate::Callback> ready;
  {
    absl::ReaderMutexLock l(&state_mu_);
    AfterAdvance(&ready, nullptr);
  }
  for (auto& f : ready) f(absl::OkStatus());
  return clock;
}

absl::StatusOr<int64_t> Job::Rejoin(uint32_t worker, uint32_t attempt) {
  absl::MutexLock c(&clock_mu_);
  absl::StatusOr<int64_t> clock = clocks_.Rejoin(worker, attempt);
  if (clock.ok()) applied_.Clear(worker);
  return clock;
}

bool Job::HasLeft(uint32_t worker) const {
  absl::MutexLock c(&clock_mu_);
  return clocks_.HasLeft(worker);
}

std::vector<uint32_t> Job::LeftWorkers() const {
  absl::MutexLock c(&clock_mu_);
  return clocks_.LeftWorkers();
}

absl::Status Job::CheckAttempt(uint32_t worker, uint32_t attempt,
                               absl::string_view field) const {
  absl::MutexLock c(&clock_mu_);
  return clocks_.CheckAttempt(worker, attempt, field);
}

bool Job::WhenReadable(int64_t clock, std::function<void(absl::Status)> ready,
                       uint64_t* wait_id) {
  absl::MutexLock c(&clock_mu_);
  if (gate_.Admits(clock) || dropped_) return true;
  *wait_id = gate_.Park(clock, std::move(ready));
  return false;
}

bool Job::ReadableAfterOwnPush(int64_t clock, uint32_t worker, int64_t step,
                               int64_t* min_clock) {
  absl::MutexLock c(&clock_mu_);
  if (worker >= clocks_.size() || dropped_) return false;
  return gate_.AdmitsAfterOwnPush(clock, step, clocks_.clock(worker), clocks_.MinOfOthers(worker),
                                  min_clock);
}

bool Job::CancelWait(uint64_t wait_id) {
  absl::MutexLock c(&clock_mu_);
  return gate_.Cancel(wait_id);
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

absl::StatusOr<PullViews::Reply> Job::ReadView(const SliceRef& s, uint64_t epoch,
                                                uint32_t worker, uint64_t held,
                                                v1::DataType dtype) {
  if (dropped_) return absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped"));
  absl::ReaderMutexLock l(&state_mu_);
  absl::Status st = CheckEpoch(epoch, "epoch");
  if (!st.ok()) return st;
  const TableState& t = tables_[s.table];
  auto b = HeldBlock(s);
  if (!b.ok()) return b.status();
  thread_local std::vector<float> weights;
  weights.resize(s.elems);
  t.dense->Read(*b, 0, s.elems, v1::DT_FLOAT32, reinterpret_cast<char*>(weights.data()));
  const float ratio = t.info->spec.compression().pull_topk_ratio();
  // A view asked of a table without pull compression: a plain pull (and no view kept).
  PullViews::Reply reply =
      pull_views_.Encode(worker, s.table, s.block, ratio > 0 ? held : 0, weights.data(),
                         s.elems, TransportType(dtype), ratio);
  CountShard(t.dense->ShardOf(s.block), reply.values.size() + reply.indices.size());
  return reply;
}

absl::StatusOr<LentBytes> Job::Lend(const SliceRef& s, uint64_t epoch, uint64_t first,
                                    uint64_t n) {
  if (dropped_) return absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped"));
  absl::ReaderMutexLock l(&state_mu_);
  absl::Status st = CheckEpoch(epoch, "epoch");
  if (!st.ok()) return st;
  const TableState& t = tables_[s.table];
  auto b = HeldBlock(s);
  if (!b.ok()) return b.status();
  CountShard(t.dense->ShardOf(s.block), n * sizeof(float));
  return t.dense->Lend(*b, first, n);
}

absl::StatusOr<DenseBlock*> Job::HeldBlock(const SliceRef& s) const {
  DenseBlock* b = s.dense ? tables_[s.table].dense->block(s.block) : nullptr;
  if (b == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slice.block: block ", s.block, " is no longer held here (epoch ", epoch_, ")"));
  }
  return b;
}

int64_t Job::RecordServedPull(int64_t reader_clock, int64_t min) {
  absl::MutexLock c(&clock_mu_);
  if (min < 0) min = clocks_.Min();
  gate_.RecordServed(reader_clock, min);
  return min;
}

}  // namespace pscluster
