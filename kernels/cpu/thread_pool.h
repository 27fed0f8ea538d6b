// A fixed pool of threads for data-parallel loops. The calling thread takes part in every loop,
// so a pool of N threads starts N - 1 workers. Workers spin briefly after a loop before they
// sleep, so the back-to-back small loops of a training step do not pay a wake-up each.
//
// Thread model: ParallelFor may be called from one thread at a time (the backend's owner). A
// ParallelFor issued from inside a running loop body runs inline on the calling thread.
#ifndef PSCLUSTER_KERNELS_CPU_THREAD_POOL_H_
#define PSCLUSTER_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pscluster::kernels {

class ThreadPool {
 public:
  // REQUIRES: num_threads >= 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), each at least `grain` long (except
  // the last), spread over the pool's threads; returns when all calls have returned.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;

  // The loop being run. Written by the caller before `generation_` is bumped; read by workers
  // after they observe the bump (release/acquire on generation_).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};
  std::atomic<int> pending_{0};  // Workers that have not finished the current loop.

  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  absl::CondVar work_cv_;  // Signalled when generation_ moves or stop_ is set.
  absl::CondVar done_cv_;  // Signalled when pending_ reaches 0.
  int sleeping_workers_ ABSL_GUARDED_BY(mu_) = 0;
  bool caller_sleeping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_CPU_THREAD_POOL_H_
