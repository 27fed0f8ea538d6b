#include "server/recent_touches.h"

#include <algorithm>

#include "common/sharding.h"

namespace pscluster {

RecentTouches::RecentTouches(int log2_width, uint64_t window)
    : log2_width_(std::clamp(log2_width, 6, 30)),
      window_(std::max<uint64_t>(window, 1)),
      counters_(new std::atomic<uint8_t>[uint64_t{kDepth} << log2_width_]) {
  for (uint64_t i = 0; i < bytes(); ++i) counters_[i].store(0, std::memory_order_relaxed);
}

uint64_t RecentTouches::Cell(int row, uint64_t key) const {
  const uint64_t h = Mix64(key ^ (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(row + 1)));
  return (uint64_t{static_cast<uint64_t>(row)} << log2_width_) + (h >> (64 - log2_width_));
}

uint32_t RecentTouches::Add(uint64_t key) {
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
  return estimate;
}

uint32_t RecentTouches::Estimate(uint64_t key) const {
  uint32_t estimate = 255;
  for (int r = 0; r < kDepth; ++r) {
    estimate = std::min<uint32_t>(estimate,
                                  counters_[Cell(r, key)].load(std::memory_order_relaxed));
  }
  return estimate;
}

void RecentTouches::Halve() {
  absl::MutexLock l(&halving_mu_);
  for (uint64_t i = 0; i < bytes(); ++i) {
    uint8_t v = counters_[i].load(std::memory_order_relaxed);
    while (v != 0 && !counters_[i].compare_exchange_weak(v, static_cast<uint8_t>(v >> 1),
                                                         std::memory_order_relaxed)) {
    }
  }
}

}  // namespace pscluster
