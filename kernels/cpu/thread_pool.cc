#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace pscluster::kernels {
namespace {

// How long an idle thread polls before it sleeps on a condition variable: longer than the gap
// between the ops of a training step, short enough not to matter to other processes.
constexpr auto kSpinTime = std::chrono::microseconds(100);

thread_local bool in_parallel_loop = false;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls `done` for up to kSpinTime, yielding the core now and then (so an oversubscribed
// machine loses little); returns whether it became true.
template <typename Pred>
bool SpinUntil(Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::yield();
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

void ThreadPool::RunChunks(Job* job) {
  const bool outer = in_parallel_loop;
  in_parallel_loop = true;
  for (;;) {
    const int64_t begin = job->next.fetch_add(job->chunk, std::memory_order_relaxed);
    if (begin >= job->n) break;
    (*job->fn)(begin, std::min(job->n, begin + job->chunk));
  }
  in_parallel_loop = outer;
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
    joined_.fetch_add(1, std::memory_order_seq_cst);
    Job* job = current_.load(std::memory_order_seq_cst);
    if (job != nullptr) RunChunks(job);
    if (joined_.fetch_sub(1, std::memory_order_seq_cst) == 1) {
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
  Job job;
  job.fn = &fn;
  job.n = n;
  job.chunk = std::max(grain, (n + 4 * threads - 1) / (4 * threads));
  current_.store(&job, std::memory_order_seq_cst);
  {
    absl::MutexLock l(&mu_);
    generation_.fetch_add(1, std::memory_order_release);
    if (sleeping_workers_ > 0) work_cv_.SignalAll();
  }
  RunChunks(&job);
  // Every chunk is claimed now; close the job and wait for the workers still running chunks.
  current_.store(nullptr, std::memory_order_seq_cst);
  auto finished = [&] { return joined_.load(std::memory_order_seq_cst) == 0; };
  if (!SpinUntil(finished)) {
    absl::MutexLock l(&mu_);
    caller_sleeping_ = true;
    while (!finished()) done_cv_.Wait(&mu_);
    caller_sleeping_ = false;
  }
}

}  // namespace pscluster::kernels
