// How often each key was touched lately, approximately: a count-min sketch of saturating 8-bit
// counters, every one of them halved each time `window` touches have been counted, so old
// touches fade (the aging of TinyLFU, Einziger et al., "TinyLFU: a highly efficient cache
// admission policy", ACM ToS 2017). The disk tier of a sparse table (table.h) asks it whether a
// row pushed while on disk is worth bringing back into memory: only one touched before, lately.
//
// Thread model: thread-safe, lock-free but for the halving sweep (one thread does it, under a
// mutex, while counting goes on). Estimates are approximate: they only ever overestimate between
// two halvings. No I/O.
#ifndef PSCLUSTER_SERVER_RECENT_TOUCHES_H_
#define PSCLUSTER_SERVER_RECENT_TOUCHES_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/synchronization/mutex.h"

namespace pscluster {

class RecentTouches {
 public:
  static constexpr int kDepth = 4;
  // 4 rows of 2^log2_width counters (one byte each).
  explicit RecentTouches(int log2_width = 20, uint64_t window = uint64_t{1} << 22);
  // Counts a touch of `key`; returns its estimate after it (at least 1, at most 255).
  uint32_t Add(uint64_t key);
  uint32_t Estimate(uint64_t key) const;
  uint64_t bytes() const { return uint64_t{kDepth} << log2_width_; }

 private:
  uint64_t Cell(int row, uint64_t key) const;
  void Halve();

  const int log2_width_;
  const uint64_t window_;
  std::unique_ptr<std::atomic<uint8_t>[]> counters_;
  std::atomic<uint64_t> touches_{0};
  absl::Mutex halving_mu_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_RECENT_TOUCHES_H_
