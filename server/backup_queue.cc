#include "server/backup_queue.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pscluster {

BackupQueue::BackupQueue(std::string address, std::shared_ptr<BackupTransport> transport,
                         absl::Duration retry_for, int senders)
    : address_(std::move(address)), transport_(std::move(transport)), retry_for_(retry_for) {
  for (int i = 0; i < std::max(1, senders); ++i) threads_.emplace_back([this] { Loop(); });
}

BackupQueue::~BackupQueue() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    if (broken_.ok()) {
      broken_ = absl::UnavailableError(absl::StrCat(
          "replicating to the backup at ", address_, ": the job's shard map changed"));
    }
    DropQueuedLocked();
  }
  for (auto& t : threads_) t.join();
}

void BackupQueue::Enqueue(v1::ReplicateRequest req, Payload values) {
  Enqueue(std::move(req), std::move(values), nullptr);
}

void BackupQueue::Enqueue(v1::ReplicateRequest req, Loader load) {
  Enqueue(std::move(req), Payload(), std::move(load));
}

void BackupQueue::Enqueue(v1::ReplicateRequest req, Payload values, Loader load) {
  absl::MutexLock l(&mu_);
  const uint64_t seq = next_seq_++;
  if (!broken_.ok()) {
    CompleteLocked(seq);  // Dropped: every later flush fails anyway.
    return;
  }
  // End-of-step markers, snapshot parts and a primary's clocks wait for everything before them,
  // and hold back everything after them.
  const bool barrier = req.chunk().end_of_step() || req.seed_size() != 0 || req.has_clocks();
  queue_.push_back(Item{seq, barrier, std::move(req), std::move(values), std::move(load)});
}

absl::Status BackupQueue::Flush(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  struct Arg {
    BackupQueue* q;
    uint64_t target;
  } arg{this, next_seq_};
  const bool delivered = mu_.AwaitWithTimeout(
      absl::Condition(
          +[](Arg* a) ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->q->low_ >= a->target; }, &arg),
      timeout);
  if (!broken_.ok()) return broken_;
  if (!delivered) {
    return absl::UnavailableError(absl::StrCat("replicating to the backup at ", address_,
                                               ": not delivered within ",
                                               absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

void BackupQueue::CompleteLocked(uint64_t seq) {
  completed_.insert(seq);
  while (!completed_.empty() && *completed_.begin() == low_) {
    completed_.erase(completed_.begin());
    ++low_;
  }
}

void BackupQueue::DropQueuedLocked() {
  for (const Item& it : queue_) CompleteLocked(it.seq);
  queue_.clear();
  barrier_pending_ = false;
}

void BackupQueue::Loop() {
  while (true) {
    Item item;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](BackupQueue* q) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return q->stop_ || (!q->queue_.empty() && !q->barrier_pending_);
          },
          this));
      if (stop_) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      if (item.barrier) {
        // An end-of-step marker advances the copy's clock: it goes only once everything queued
        // before it has arrived, and nothing after it is sent meanwhile.
        barrier_pending_ = true;
        struct Arg {
          BackupQueue* q;
          uint64_t seq;
        } arg{this, item.seq};
        mu_.Await(absl::Condition(
            +[](Arg* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return a->q->stop_ || a->q->low_ >= a->seq;
            },
            &arg));
        if (stop_) return;
      }
    }
    // A repeat is a duplicate on the backup: retry for a while (the backup may be restarting,
    // or not have the map yet).
    const absl::Time give_up = absl::Now() + retry_for_;
    absl::Duration backoff = absl::Milliseconds(10);
    absl::Status s = item.load ? item.load(item.req) : absl::OkStatus();
    const bool loaded = s.ok();
    if (loaded) s = transport_->Send(address_, item.req, item.values);
    while (loaded && !s.ok() && absl::Now() + backoff < give_up) {
      {
        absl::MutexLock l(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stop_), backoff)) return;
      }
      backoff = std::min(backoff * 2, absl::Seconds(1));
      s = transport_->Send(address_, item.req, item.values);
    }
    absl::MutexLock l(&mu_);
    if (item.barrier) barrier_pending_ = false;
    CompleteLocked(item.seq);
    if (!s.ok() && broken_.ok()) {
      broken_ = absl::UnavailableError(
          absl::StrCat("replicating to the backup at ", address_, ": ", s.message()));
      Logger("server")->error("{}; pushes to the shards it backs up fail until the shard map "
                              "changes", broken_.message());
      DropQueuedLocked();
    }
  }
}

}  // namespace pscluster
