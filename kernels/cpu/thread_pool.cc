#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace pscluster::kernels {
namespace {

// How long an idle thread polls before it sleeps on a condition variable.
constexpr auto kSpinTime = std::chrono::microseconds(200);

thread_local bool in_parallel_loop = false;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls `done` for up to kSpinTime; returns whether it became true.
template <typename Pred>
bool SpinUntil(Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  const int workers = std::max(num_threads, 1) - 1;
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock l(&mu_);
    stop_.store(true, std::memory_order_release);
    work_cv_.SignalAll();
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  in_parallel_loop = true;
  for (;;) {
    const int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
    if (begin >= n_) break;
    (*fn_)(begin, std::min(n_, begin + chunk_));
  }
  in_parallel_loop = false;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    auto ready = [&] {
      return generation_.load(std::memory_order_acquire) != seen ||
             stop_.load(std::memory_order_acquire);
    };
    if (!SpinUntil(ready)) {
      absl::MutexLock l(&mu_);
      ++sleeping_workers_;
      while (!ready()) work_cv_.Wait(&mu_);
      --sleeping_workers_;
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    RunChunks();
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      absl::MutexLock l(&mu_);
      if (caller_sleeping_) done_cv_.Signal();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (workers_.empty() || n <= grain || in_parallel_loop) {
    fn(0, n);
    return;
  }
  // About four chunks per thread balance uneven chunks without much scheduling traffic.
  const int64_t threads = num_threads();
  const int64_t chunk = std::max(grain, (n + 4 * threads - 1) / (4 * threads));
  fn_ = &fn;
  n_ = n;
  chunk_ = chunk;
  next_.store(0, std::memory_order_relaxed);
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    absl::MutexLock l(&mu_);
    generation_.fetch_add(1, std::memory_order_release);
    if (sleeping_workers_ > 0) work_cv_.SignalAll();
  }
  RunChunks();
  auto finished = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!SpinUntil(finished)) {
    absl::MutexLock l(&mu_);
    caller_sleeping_ = true;
    while (!finished()) done_cv_.Wait(&mu_);
    caller_sleeping_ = false;
  }
  fn_ = nullptr;
}

}  // namespace pscluster::kernels
