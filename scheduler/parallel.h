// Side-by-side calls to several daemons from the scheduler's loops, so that one slow node costs
// one deadline, not many.
#ifndef PSCLUSTER_SCHEDULER_PARALLEL_H_
#define PSCLUSTER_SCHEDULER_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

namespace pscluster::scheduler {

inline constexpr size_t kMaxParallelCalls = 32;

// Runs fn(0) ... fn(n - 1) on up to kMaxParallelCalls threads and returns when all are done.
inline void ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n <= 1) {
    if (n == 1) fn(0);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < std::min(n, kMaxParallelCalls); ++t) {
    threads.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_PARALLEL_H_
