#include "server/recent_touches.h"

#include <algorithm>

#include "common/sharding.h"

namespace pscluster {

RecentTouches::RecentTouches(int log2_width, uint64_t window)
    : log2_width_(std::clamp(log2_width, 6, 30)),
      window_(std::max<uint64_t>(window, 1)),
      counters_(new std::atomic<uint8_t>[uint64_t{kDepth} << log2_width_]),
      doorkeeper_(new std::atomic<uint64_t>[doorkeeper_words()]) {
  for (uint64_t i = 0; i < counter_bytes(); ++i) counters_[i].store(0, std::memory_order_relaxed);
  for (uint64_t i = 0; i < doorkeeper_words(); ++i) {
    doorkeeper_[i].store(0, std::memory_order_relaxed);
  }
}

uint64_t RecentTouches::DoorkeeperBit(int i, uint64_t key) const {
  const int log2_bits = log2_width_ + 5;  // kDepth * 8 bits per counter: 2^(log2_width + 5).
  return Mix64(key + 0xc2b2ae3d27d4eb4fULL * static_cast<uint64_t>(i + 1)) >> (64 - log2_bits);
}

bool RecentTouches::InDoorkeeper(uint64_t key) const {
  for (int i = 0; i < kDoorkeeperHashes; ++i) {
    const uint64_t bit = DoorkeeperBit(i, key);
    if ((doorkeeper_[bit >> 6].load(std::memory_order_relaxed) & (uint64_t{1} << (bit & 63))) ==
        0) {
      return false;
    }
  }
  return true;
}

bool RecentTouches::PassDoorkeeper(uint64_t key) {
  bool seen = true;
  for (int i = 0; i < kDoorkeeperHashes; ++i) {
    const uint64_t bit = DoorkeeperBit(i, key);
    const uint64_t mask = uint64_t{1} << (bit & 63);
    std::atomic<uint64_t>& word = doorkeeper_[bit >> 6];
    if ((word.load(std::memory_order_relaxed) & mask) == 0) {
      word.fetch_or(mask, std::memory_order_relaxed);
      seen = false;
    }
  }
  return seen;
}

uint64_t RecentTouches::Cell(int row, uint64_t key) const {
  const uint64_t h = Mix64(key ^ (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(row + 1)));
  return (uint64_t{static_cast<uint64_t>(row)} << log2_width_) + (h >> (64 - log2_width_));
}

uint32_t RecentTouches::Add(uint64_t key) {
  if (!PassDoorkeeper(key)) {
    // The first touch of the window: the doorkeeper's only.
    const uint32_t estimate = 1 + CounterEstimate(key);
    if ((touches_.fetch_add(1, std::memory_order_relaxed) + 1) % window_ == 0) Halve();
    return estimate;
  }
  uint32_t estimate = 255;
  for (int r = 0; r < kDepth; ++r) {
    std::atomic<uint8_t>& c = counters_[Cell(r, key)];
    uint8_t v = c.load(std::memory_order_relaxed);
    while (v < 255 && !c.compare_exchange_weak(v, static_cast<uint8_t>(v + 1),
                                               std::memory_order_relaxed)) {
    }
    estimate = std::min<uint32_t>(estimate, v < 255 ? v + 1u : 255u);
  }
  if ((touches_.fetch_add(1, std::memory_order_relaxed) + 1) % window_ == 0) Halve();
  return estimate + 1;
}

uint32_t RecentTouches::Estimate(uint64_t key) const {
  return CounterEstimate(key) + (InDoorkeeper(key) ? 1 : 0);
}

uint32_t RecentTouches::CounterEstimate(uint64_t key) const {
  uint32_t estimate = 255;
  for (int r = 0; r < kDepth; ++r) {
    estimate = std::min<uint32_t>(estimate,
                                  counters_[Cell(r, key)].load(std::memory_order_relaxed));
  }
  return estimate;
}

void RecentTouches::Halve() {
  absl::MutexLock l(&halving_mu_);
  // The doorkeeper starts the window empty: a key's next touch is a first one again.
  for (uint64_t i = 0; i < doorkeeper_words(); ++i) {
    doorkeeper_[i].store(0, std::memory_order_relaxed);
  }
  for (uint64_t i = 0; i < counter_bytes(); ++i) {
    uint8_t v = counters_[i].load(std::memory_order_relaxed);
    while (v != 0 && !counters_[i].compare_exchange_weak(v, static_cast<uint8_t>(v >> 1),
                                                         std::memory_order_relaxed)) {
    }
  }
}

}  // namespace pscluster
