// Job's push path: a chunk checked against the job (epoch, rank, step, attempt, dtype, slice),
// its exactly-once record, its update applied (or aggregated across the step's ranks), and the
// clock advanced once a rank's step is complete.
#include "server/job.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/grad_compress.h"
#include "common/logging.h"
#include "common/sharding.h"
#include "server/validate.h"

namespace pscluster {
namespace {

// An int8 push (CompressionSpec.quantize) widened to float32: values[i] * scales[i / group].
// REQUIRES: ValidatePushEncoding accepted the chunk.
Payload DequantizePush(const v1::PushChunk& chunk, const Payload& values) {
  const uint64_t n = values.size();
  std::vector<float> scales(chunk.scales().size() / 4);
  std::memcpy(scales.data(), chunk.scales().data(), chunk.scales().size());
  std::string q = values.ToString();
  std::string wide(n * sizeof(float), '\0');
  DequantizeInt8(reinterpret_cast<const int8_t*>(q.data()), n, chunk.scale_group(),
                 scales.data(), reinterpret_cast<float*>(wide.data()));
  return Payload::FromString(std::move(wide));
}

}  // namespace

// ------------------------------------------------------------------ push

absl::StatusOr<PushResult> Job::Push(const v1::PushChunk& chunk, const Payload& values,
                                     absl::FunctionRef<std::string()> node_id,
                                     absl::FunctionRef<bool(int64_t at)> stream_checkpoint) {
  if (dropped_) {
    return absl::NotFoundError(absl::StrCat("tag.job_id: job '", id(), "' was dropped"));
  }
  std::vector<ReadGate::Callback> ready;
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
    // (A job with a disk tier writes it now, streamed: its tables may not fit in memory twice.)
    if (!(HasDiskTier() && stream_checkpoint(hold))) {
      auto snap = MakeCheckpoint(node_id(), absl::ToUnixMillis(clock_->Now()), hold);
      if (snap.ok() && r.ok()) r->checkpoint = std::make_shared<const Snapshot>(std::move(*snap));
    }
    ReleaseHeld(hold, &ready);
  }
  for (auto& f : ready) f(absl::OkStatus());
  return r;
}

absl::StatusOr<PushResult> Job::PushLocked(const v1::PushChunk& chunk, const Payload& received,
                                           std::vector<ReadGate::Callback>* ready,
                                           int64_t* hold) {
  if (sealed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", id(), "': this copy was taken over by its server and takes no more updates"));
  }
  absl::Status st = CheckEpoch(chunk.epoch(), "epoch");
  if (!st.ok()) return st;
  const v1::Tag& tag = chunk.tag();
  st = ValidatePushTag(chunk, id(), config_.num_workers);
  if (!st.ok()) return st;
  st = CheckAttempt(tag.worker(), tag.attempt(), "tag.attempt");
  if (!st.ok()) return st;
  st = ValidatePushEncoding(chunk, received.size(), limits_.max_chunk_bytes);
  if (!st.ok()) return st;
  // int8 values are widened to float32 first; everything below sees floats.
  v1::DataType dtype = TransportType(chunk.dtype());
  Payload widened;
  if (dtype == v1::DT_INT8) {
    widened = DequantizePush(chunk, received);
    dtype = v1::DT_FLOAT32;
  }
  const Payload& values = chunk.dtype() == v1::DT_INT8 ? widened : received;
  const bool has_slice = !chunk.slice().table().empty();
  if (!values.empty() || chunk.end_of_step()) {
    // A worker pushes its current step (its clock) or, at most, the next one. A push further
    // ahead would move the clock past steps the worker has not pushed yet, and its real pushes
    // of those steps would then be taken for duplicates: refused in every consistency mode.
    // (A chunk with no values that ends no step only asks for a pull: its step is the pull's.)
    absl::MutexLock c(&clock_mu_);
    // A server that joined the job in the middle of its run: the rank's first push sets where
    // it stands.
    clocks_.ObservePush(tag.worker(), tag.step());
    const int64_t clock = clocks_.clock(tag.worker());
    if (tag.step() > clock + 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tag.step: step ", tag.step(), " is more than one step ahead of rank ", tag.worker(),
          "'s clock ", clock, " in job '", id(), "' (it has completed steps below ", clock,
          "); push step ", clock, " first"));
    }
  }
  SliceRef s;
  uint64_t n = 0;
  if (has_slice) {
    auto r = Resolve(chunk.slice(), "slice");
    if (!r.ok()) return r.status();
    s = std::move(*r);
    PushTarget target{s.dense, s.block, s.elems, s.dense ? 1 : tables_[s.table].info->width};
    st = ValidatePushExtent(chunk, target, dtype, values.size(), &n);
    if (!st.ok()) return st;
  }

  PushResult result;
  const uint32_t w = tag.worker();
  const uint64_t identity =
      has_slice ? AppliedRecord::ChunkIdentity(tag.seq(), s.table, s.dense, s.block, s.keys_hash,
                                               chunk.offset(), n)
                : 0;
  if (n > 0) {
    absl::MutexLock c(&clock_mu_);
    result.duplicate = !applied_.Record(w, tag.step(), clocks_.clock(w), identity);
  }
  if (n > 0 && !result.duplicate) {
    absl::Status a = config_.consistency.aggregate() ? Aggregate(s, chunk, values, dtype, n)
                                                     : ApplyValues(s, chunk, values, dtype, n,
                                                                   &result.row_decisions);
    if (!a.ok()) {
      absl::MutexLock c(&clock_mu_);
      applied_.Forget(w, tag.step(), identity);
      return a;
    }
    result.applied = true;
    CountShard(ShardOfSlice(s), received.size());
  }
  if (has_slice) result.shard = ShardOfSlice(s);
  bool advanced = false;
  {
    absl::MutexLock c(&clock_mu_);
    // Fenced while its values were applied (they stay, recorded under their tag, so that the
    // newer task's copy of this chunk is a duplicate): the step does not complete for it.
    absl::Status fenced = clocks_.CheckAttempt(w, tag.attempt(), "tag.attempt");
    if (!fenced.ok()) return fenced;
    if (chunk.end_of_step() && clocks_.clock(w) < tag.step() + 1) {
      advanced = clocks_.Complete(w, tag.step());
      applied_.Trim(w, clocks_.clock(w));
    }
    result.clock = clocks_.clock(w);
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
  // Called from the heartbeat: never wait behind a map change or a checkpoint (which hold the
  // lock exclusively for as long as a snapshot of the tables takes); the next tick collects.
  if (!state_mu_.ReaderTryLock()) return 0;
  const int64_t min = min_clock();
  uint64_t n = 0;
  for (const auto& t : tables_) {
    if (t.sparse) n += t.sparse->CollectExpired(min, budget_);
  }
  state_mu_.ReaderUnlock();
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
    if (made.code() == absl::StatusCode::kResourceExhausted && !config_.spill_dir.empty()) {
      // Rows an aggregated step will update must be there when it applies, after its pushes
      // were acknowledged: no spill or disk read may fail then.
      return absl::ResourceExhaustedError(absl::StrCat(
          made.message(), "; job '", id(), "' aggregates its steps (consistency.aggregate), and "
          "the rows of such jobs stay in memory: the disk tier under --spill_dir ",
          config_.spill_dir, " is not used for them"));
    }
    if (!made.ok()) return made;
  }
  const int64_t step = chunk.tag().step();
  if (s.dense) {
    agg_.AddDense(step, s.table, s.block, s.elems, [&](float* sum) {
      if (chunk.indices().empty()) {
        // Added straight from the payload (decoded through a small buffer when not float32).
        float scratch[4096];
        float* dst = sum + chunk.offset();
        values.ForEachFloatRun(dtype, 0, n, scratch, 4096,
                               [&](size_t i, const float* g, size_t k) {
                                 float* d = dst + i;
                                 for (size_t j = 0; j < k; ++j) d[j] += g[j];
                               });
        return;
      }
      std::vector<float> g(n);
      values.DecodeFloats(dtype, 0, n, g.data());
      for (uint64_t i = 0; i < n; ++i) {
        uint32_t idx;
        std::memcpy(&idx, chunk.indices().data() + 4 * i, 4);
        sum[idx] += g[i];
      }
    });
    return absl::OkStatus();
  }
  std::vector<float> g(n);
  values.DecodeFloats(dtype, 0, n, g.data());
  const uint32_t width = tables_[s.table].info->width;
  agg_.AddSparse(step, s.table, width,
                 absl::Span<const uint64_t>(s.keys.data() + chunk.offset() / width, n / width),
                 g.data());
  return absl::OkStatus();
}

}  // namespace pscluster
