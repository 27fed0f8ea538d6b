// Bytes of parameters and optimizer state a server may hold (--memory_bytes), shared by all jobs.
#ifndef PSCLUSTER_SERVER_MEMORY_BUDGET_H_
#define PSCLUSTER_SERVER_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>

namespace pscluster {

class MemoryBudget {
 public:
  // limit 0 = unlimited. Thread-safe.
  explicit MemoryBudget(uint64_t limit) : limit_(limit) {}

  // Takes `bytes` if they fit under the limit; false (and nothing taken) otherwise.
  bool TryReserve(uint64_t bytes) {
    uint64_t cur = used_.load(std::memory_order_relaxed);
    do {
      if (limit_ != 0 && (bytes > limit_ || cur > limit_ - bytes)) return false;
    } while (!used_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
    return true;
  }
  void Release(uint64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_MEMORY_BUDGET_H_
