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
  // One ParallelFor call; lives on the caller's stack.
  struct Job {
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0;
    int64_t chunk = 1;
    std::atomic<int64_t> next{0};  // First index not yet claimed.
  };

  void WorkerLoop();
  static void RunChunks(Job* job);

  std::vector<std::thread> workers_;

  // The job being run, or null. A worker joins a job by incrementing joined_ and then loading
  // current_; the caller closes it by storing null and then waiting for joined_ to reach 0
  // (both sequentially consistent, so a worker either sees null or is waited for). Workers that
  // never woke up are not waited for: once every chunk is claimed, the caller returns.
  std::atomic<Job*> current_{nullptr};
  std::atomic<int> joined_{0};

  std::atomic<uint64_t> generation_{0};  // Bumped for every job, to wake workers.
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  absl::CondVar work_cv_;  // Signalled when generation_ moves or stop_ is set.
  absl::CondVar done_cv_;  // Signalled when joined_ reaches 0 while the caller sleeps.
  int sleeping_workers_ ABSL_GUARDED_BY(mu_) = 0;
  bool caller_sleeping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_CPU_THREAD_POOL_H_
