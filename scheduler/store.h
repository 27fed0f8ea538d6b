// The scheduler's durable state in an embedded SQLite database (WAL mode): jobs, nodes, shard
// maps and id counters. Every write is one transaction, so a crash at any point (kill -9) leaves
// the previous or the new state, never a mix. The database is held with an exclusive lock: a
// second scheduler opening the same file is refused instead of corrupting it.
//
// Thread-safe: one connection behind a mutex.
#ifndef PSCLUSTER_SCHEDULER_STORE_H_
#define PSCLUSTER_SCHEDULER_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/scheduler.pb.h"

struct sqlite3;

namespace pscluster::scheduler {

struct StoreOptions {
  // Database file; ":memory:" keeps everything in memory (tests, benchmarks).
  std::string path;
  // true: every commit is fsynced (survives power loss); false: WAL's NORMAL sync (survives a
  // killed process, may lose the last commits on power loss).
  bool full_sync = true;
};

struct StoredJob {
  v1::Job job;
  std::string client_token;  // Idempotency key of the submission ("" = none).
  v1::ShardMap shard_map;    // Latest shard map (empty when the job was never placed).
};

class Store {
 public:
  // Opens (creating if missing) the database. Errors name the file: a directory that does not
  // exist, a file that is not a database, a database held by another scheduler, a schema newer
  // than this build.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const StoreOptions& options);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Next value of a named counter (1, 2, 3, ...), durable across restarts.
  absl::StatusOr<uint64_t> NextId(absl::string_view counter);

  absl::Status PutNode(const v1::NodeStatus& node);
  absl::StatusOr<std::vector<v1::NodeStatus>> LoadNodes();

  // Inserts or replaces a job (and, when `map` is given, records that shard map) atomically.
  absl::Status PutJob(const v1::Job& job, absl::string_view client_token,
                      const v1::ShardMap* map = nullptr);
  // Every job, oldest first, with its latest shard map.
  absl::StatusOr<std::vector<StoredJob>> LoadJobs();

  const std::string& path() const { return path_; }

 private:
  Store(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(absl::string_view what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  const std::string path_;
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_STORE_H_
