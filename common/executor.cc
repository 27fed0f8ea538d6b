#include "common/executor.h"

#include <atomic>
#include <memory>

namespace pscluster {

Executor::Executor(int threads, std::string name) : name_(std::move(name)) {
  if (threads < 1) threads = 1;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

Executor::~Executor() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) t.join();
}

void Executor::Post(std::function<void()> fn) {
  absl::MutexLock l(&mu_);
  queue_.push_back(std::move(fn));
}

void Executor::Loop() {
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](Executor* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
            return e->stopping_ || !e->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // Stopping and drained.
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

void SerialQueue::Post(Task task, bool run_inline) {
  {
    absl::MutexLock l(&mu_);
    tasks_.push_back(std::move(task));
    if (running_) return;
    running_ = true;
  }
  if (run_inline) {
    Drain();
  } else {
    schedule_([this] { Drain(); });
  }
}

size_t SerialQueue::size() const {
  absl::MutexLock l(&mu_);
  return tasks_.size() + (running_ ? 1 : 0);
}

void SerialQueue::Clear() {
  std::deque<Task> dropped;
  {
    absl::MutexLock l(&mu_);
    dropped.swap(tasks_);
  }
  // `dropped` dies here, outside the lock (tasks may own references to the queue's owner).
}

void SerialQueue::Drain() {
  while (true) {
    Task task;
    {
      absl::MutexLock l(&mu_);
      if (tasks_.empty()) {
        running_ = false;
        return;
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    // 0: running; 1: done called while running (continue here); 2: returned first (the
    // later `done` continues the queue on another thread).
    auto state = std::make_shared<std::atomic<int>>(0);
    task([this, state] {
      int expected = 0;
      if (!state->compare_exchange_strong(expected, 1)) schedule_([this] { Drain(); });
    });
    int expected = 0;
    if (state->compare_exchange_strong(expected, 2)) return;  // Finishes asynchronously.
  }
}

}  // namespace pscluster
