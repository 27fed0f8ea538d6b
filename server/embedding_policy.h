// Admission and expiry of a sparse table's rows (v1::EmbeddingSpec): which keys get a row, and
// when an idle row counts as gone.
//
// What a push does to each of its distinct keys is one RowDecision. A primary decides; the
// copies of its shards (replication) receive its decisions with the chunk
// (PushChunk.row_decisions) and follow them, so that a copy never decides differently because
// its sketch or its clocks saw the chunks in another order.
#ifndef PSCLUSTER_SERVER_EMBEDDING_POLICY_H_
#define PSCLUSTER_SERVER_EMBEDDING_POLICY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"

namespace pscluster {

enum RowDecision : uint8_t {
  kRowCounted = 0,    // Not admitted: counted, not applied; no row made.
  kRowApplied = 1,    // Applied; the row made from the initializer if absent.
  kRowRestarted = 2,  // The row had expired: restarted from the initializer, then applied.
};

// A count-min sketch of 32-bit counters in kDepth rows: Add and Estimate never undercount a key;
// they overcount it by at most the pushes of keys sharing a counter with it in every row.
// Thread-safe (relaxed atomics).
class CountMinSketch {
 public:
  static constexpr int kDepth = 4;
  // Uses about `bytes` of memory (at least one 64-counter row each).
  explicit CountMinSketch(uint64_t bytes);
  // Counts one push of `key`; returns its estimate after it.
  uint32_t Add(uint64_t key);
  uint32_t Estimate(uint64_t key) const;
  uint64_t bytes() const { return uint64_t{kDepth} * width_ * sizeof(uint32_t); }

  // The counters as bytes() bytes (little-endian uint32, row after row): a checkpoint's copy.
  void AppendTo(std::string* out) const;
  // Adds counters written by AppendTo of a sketch of the same size (saturating): a restored
  // checkpoint's counts, or several servers' (of disjoint keys) together. Every key's estimate
  // afterwards is at least the sum of its counts in both. INVALID_ARGUMENT for another size.
  absl::Status AddFrom(absl::string_view counters);

 private:
  uint64_t Cell(int row, uint64_t key) const;
  uint64_t width_;
  std::unique_ptr<std::atomic<uint32_t>[]> counters_;
};

// A table's policy, from its EmbeddingSpec. REQUIRES: ValidateEmbedding passed.
class EmbeddingPolicy {
 public:
  static constexpr uint64_t kDefaultSketchBytes = 1 << 20;

  EmbeddingPolicy(const v1::EmbeddingSpec& spec, uint64_t table_hash, uint64_t seed);

  // Whether `spec` declares any policy (otherwise pushes make rows and nothing expires).
  static bool Active(const v1::EmbeddingSpec& spec) {
    return spec.admit_after_pushes() > 1 ||
           (spec.admit_probability() > 0.f && spec.admit_probability() < 1.f) ||
           spec.expire_after_steps() > 0 || spec.expire_after_seconds() > 0;
  }
  bool active() const { return admits_ || expires(); }
  bool expires() const { return expire_steps_ > 0 || expire_ms_ > 0; }
  bool admits() const { return admits_; }

  // For a key without a row pushed at `step`: whether this push makes its row (and counts it).
  bool Admit(uint64_t key, int64_t step);
  // Whether a row last pushed at (last_step, last_ms) has expired for an access at
  // (step, now_ms).
  bool Expired(int64_t last_step, int64_t last_ms, int64_t step, int64_t now_ms) const;
  // Whether a row may be removed now, with every future push at a step >= min_clock: it will
  // have expired for all of them. Seconds-expired rows are removed only after twice their
  // expiry (at least a minute more): a copy's clock stamps lag its primary's by the
  // replication delay, and a copy must not drop a row its primary still counts as live.
  bool Collectable(int64_t last_step, int64_t last_ms, int64_t min_clock, int64_t now_ms) const;

  uint64_t sketch_bytes() const { return sketch_ ? sketch_->bytes() : 0; }
  // The count filter's sketch (null without one).
  const CountMinSketch* sketch() const { return sketch_.get(); }
  CountMinSketch* mutable_sketch() { return sketch_.get(); }

 private:
  bool admits_ = false;
  uint32_t after_pushes_ = 0;
  float probability_ = 0;
  uint64_t draw_seed_ = 0;
  int64_t expire_steps_ = 0;
  int64_t expire_ms_ = 0;
  std::unique_ptr<CountMinSketch> sketch_;
};

// Checks `spec` for a table of kind `kind`; INVALID_ARGUMENT names `field` and the member.
absl::Status ValidateEmbedding(const v1::EmbeddingSpec& spec, v1::TableKind kind,
                               absl::string_view field);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_EMBEDDING_POLICY_H_
