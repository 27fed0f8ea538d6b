// A fixed pool of threads running posted closures, and a serial queue on top of it that runs
// (possibly asynchronous) tasks one at a time in order.
#ifndef PSCLUSTER_COMMON_EXECUTOR_H_
#define PSCLUSTER_COMMON_EXECUTOR_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pscluster {

class Executor {
 public:
  // Starts `threads` (>= 1) threads named for logs by `name`.
  Executor(int threads, std::string name);
  // Runs what was posted, then joins the threads.
  ~Executor();

  void Post(std::function<void()> fn);
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();

  const std::string name_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Runs tasks one at a time, in the order posted, on an executor. A task receives `done` and
// calls it (from any thread, exactly once) when it has finished, so a task may wait for
// something without holding a thread. Thread-safe.
class SerialQueue {
 public:
  using Done = std::function<void()>;
  using Task = std::function<void(Done)>;

  // `schedule` hands a closure to a thread (normally Executor::Post, wrapped so that it keeps
  // the queue's owner alive). REQUIRES: the queue outlives every scheduled closure.
  explicit SerialQueue(std::function<void(std::function<void()>)> schedule)
      : schedule_(std::move(schedule)) {}

  // Queues `task`. With run_inline, an idle queue runs it on the calling thread right away.
  void Post(Task task, bool run_inline = false);
  // Tasks queued or running.
  size_t size() const;
  // Drops the queued tasks (not the running one); used when their owner is being torn down.
  void Clear();

 private:
  void Drain();

  std::function<void(std::function<void()>)> schedule_;
  mutable absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_EXECUTOR_H_
