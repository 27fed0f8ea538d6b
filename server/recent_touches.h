// How often each key was touched lately, approximately: a count-min sketch of saturating 8-bit
// counters, every one of them halved each time `window` touches have been counted, so old
// touches fade (the aging of TinyLFU, Einziger et al., "TinyLFU: a highly efficient cache
// admission policy", ACM ToS 2017). The disk tier of a sparse table (table.h) asks it whether a
// row pushed while on disk is worth bringing back into memory: only one touched before, lately.
//
// A doorkeeper in front of the counters (TinyLFU's, a Bloom filter emptied at each halving) takes
// a key's first touch of the window: only a key touched again is counted in the sketch. Keys
// touched once — most of a skewed key space, and every key of a table being filled — so leave
// the counters alone, and a table filled with 10^8 keys does not raise every key's estimate to
// the noise of 10^8 touches over 2^20 counters a row.
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
  static constexpr int kDoorkeeperHashes = 3;
  // 4 rows of 2^log2_width counters (one byte each), and a doorkeeper of as many bytes (8 bits a
  // touch of a full window at the defaults: about 3% of keys not seen yet taken as seen).
  explicit RecentTouches(int log2_width = 20, uint64_t window = uint64_t{1} << 22);
  // Counts a touch of `key`; returns its estimate after it (at least 1, at most 256): the
  // sketch's count of its touches after the first in the window, plus one for the first.
  uint32_t Add(uint64_t key);
  uint32_t Estimate(uint64_t key) const;
  uint64_t bytes() const { return counter_bytes() + doorkeeper_bytes(); }
  uint64_t counter_bytes() const { return uint64_t{kDepth} << log2_width_; }
  uint64_t doorkeeper_bytes() const { return doorkeeper_words() * sizeof(uint64_t); }

 private:
  uint64_t Cell(int row, uint64_t key) const;
  uint64_t doorkeeper_words() const { return uint64_t{kDepth} << log2_width_ >> 3; }
  uint64_t DoorkeeperBit(int i, uint64_t key) const;
  bool InDoorkeeper(uint64_t key) const;
  // Sets the key's bits; returns whether they all were set already.
  bool PassDoorkeeper(uint64_t key);
  uint32_t CounterEstimate(uint64_t key) const;
  void Halve();

  const int log2_width_;
  const uint64_t window_;
  std::unique_ptr<std::atomic<uint8_t>[]> counters_;
  std::unique_ptr<std::atomic<uint64_t>[]> doorkeeper_;
  std::atomic<uint64_t> touches_{0};
  absl::Mutex halving_mu_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_RECENT_TOUCHES_H_
