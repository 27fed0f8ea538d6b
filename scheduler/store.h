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

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/scheduler.pb.h"

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
  std::string owner;         // Identity that submitted it ("" = unauthenticated).
  v1::ShardMap shard_map;    // Latest shard map (empty when the job was never placed).
};

// What the scheduler keeps durable. Open() gives the SQLite implementation; tests wrap it
// (scheduler/testing/failing_store.h) to make writes fail on demand.
//
// Thread-safe.
class Store {
 public:
  // Opens (creating if missing) the SQLite database. Errors name the file: a directory that
  // does not exist, a file that is not a database, a database held by another scheduler, a
  // schema newer than this build.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const StoreOptions& options);
  virtual ~Store() = default;

  // Next value of a named counter (1, 2, 3, ...), durable across restarts.
  virtual absl::StatusOr<uint64_t> NextId(absl::string_view counter) = 0;

  // The epoch of a job's next shard map, above `current` (the map in force): here current + 1;
  // the etcd store (etcd_store.h) takes it from an etcd revision. A write for a store that needs
  // one: a failure is the store's, as any write's.
  virtual absl::StatusOr<uint64_t> NextEpoch(absl::string_view job_id, uint64_t current) {
    return current + 1;
  }

  // The cluster's secret key: 32 random bytes made on the first call, the same ever after
  // (restarts included). Each job's data secret is derived from it (common/data_auth.h).
  virtual absl::StatusOr<std::string> ClusterKey() = 0;

  virtual absl::Status PutNode(const v1::NodeStatus& node) = 0;
  virtual absl::StatusOr<std::vector<v1::NodeStatus>> LoadNodes() = 0;

  // Inserts or replaces a job (and, when `map` is given, records that shard map) atomically.
  // `owner` is recorded by the job's first write only: a job never changes hands.
  virtual absl::Status PutJob(const v1::Job& job, absl::string_view client_token,
                              const v1::ShardMap* map = nullptr,
                              absl::string_view owner = "") = 0;
  // Every job, oldest first, with its latest shard map.
  virtual absl::StatusOr<std::vector<StoredJob>> LoadJobs() = 0;

  // Where the state lives, for messages ("/var/lib/pscluster/scheduler.db").
  virtual const std::string& path() const = 0;
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_STORE_H_
