// Ordered, asynchronous Replicate calls from a primary to one backup server (replication > 1).
//
// A primary queues each chunk it applied (and each end-of-step marker) and goes on applying the
// next one; the queue's threads send them, several calls at once, each retried for a while on
// failure (the backup applies every tag once, so a repeat is harmless). An end-of-step marker is
// a barrier: it goes only after everything queued before it has arrived, so that a copy's clock
// never runs ahead of its shards; so is each part of a live copy's snapshot, which thus arrives
// after every chunk queued before it and before every chunk queued after it. Before a push is acknowledged its last chunk waits in Flush()
// until everything queued before it has arrived: the backups have every acknowledged push, but
// the copies travel while the worker sends and the primary applies the rest of the round.
//
// Thread-safe. A call that keeps failing past the retry window breaks the queue for good: every
// later Flush() fails (UNAVAILABLE naming the backup) until the job's next shard map replaces
// the queue, which the scheduler sends when it drops the backup.
#ifndef PSCLUSTER_SERVER_BACKUP_QUEUE_H_
#define PSCLUSTER_SERVER_BACKUP_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ps.pb.h"
#include "server/backup_transport.h"
#include "server/payload.h"

namespace pscluster {

class BackupQueue {
 public:
  // Items go to `address` over `transport` (shared by the queues of one server).
  BackupQueue(std::string address, std::shared_ptr<BackupTransport> transport,
              absl::Duration retry_for = absl::Seconds(10), int senders = 4);
  // Drops what is still queued and joins the threads. REQUIRES: no Flush() in progress (its
  // callers hold the queue through the job's replication state).
  ~BackupQueue();
  BackupQueue(const BackupQueue&) = delete;
  BackupQueue& operator=(const BackupQueue&) = delete;

  const std::string& address() const { return address_; }
  void Enqueue(v1::ReplicateRequest req, Payload values = Payload());
  // Completes a request just before it is sent (the part of a snapshot, read from its spool file
  // when its turn comes, so that a queued snapshot takes no memory); its error breaks the queue
  // as a failed call does.
  using Loader = std::function<absl::Status(v1::ReplicateRequest&)>;
  void Enqueue(v1::ReplicateRequest req, Loader load);
  // Waits until everything queued before this call was delivered. UNAVAILABLE naming the backup
  // when some of it could not be, or `timeout` passed.
  absl::Status Flush(absl::Duration timeout);
  // Whether a call failed past its retries (every later flush fails).
  bool broken() {
    absl::MutexLock l(&mu_);
    return !broken_.ok();
  }

 private:
  void Enqueue(v1::ReplicateRequest req, Payload values, Loader load);
  struct Item {
    uint64_t seq = 0;
    bool barrier = false;  // An end-of-step marker or a part of a live copy's snapshot.
    v1::ReplicateRequest req;
    Payload values;
    Loader load;  // Null: `req` is complete.
  };
  void Loop();
  void CompleteLocked(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropQueuedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string address_;
  const std::shared_ptr<BackupTransport> transport_;
  const absl::Duration retry_for_;
  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Every item below `low_` is done (delivered, or dropped once broken); `completed_` holds the
  // done ones above it.
  uint64_t low_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<uint64_t> completed_ ABSL_GUARDED_BY(mu_);
  bool barrier_pending_ ABSL_GUARDED_BY(mu_) = false;  // A marker waits: nothing else goes.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_BACKUP_QUEUE_H_
