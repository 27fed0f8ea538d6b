// The scheduler's job table: every job it knows (queued, placing, running, and the ended ones it
// still lists), in submission order, found by id or by the client token it was submitted with,
// and their persistence.
//
// A job is written to the Store before anything about it is published. A write that fails is
// the table's sticky error (leveldb's bg_error_): from then on Persist() and Add() refuse with
// that error, which names the store, until the owner has found the store working again and
// reloaded the table from it (Clear(), Load(), ClearError()) — what a failed write held was
// never published, and a reload drops it, as a restart would.
//
// Not thread-safe: the Scheduler guards its table with its mutex (scheduler.h's mu_). The
// passes iterate it oldest first (`for (JobRecord& rec : table)`); ListJobs and ClusterStatus
// newest first (NewestFirst()). A JobRecord* stays valid until the next Add(), Load() or
// Clear().
#ifndef PSCLUSTER_SCHEDULER_JOB_TABLE_H_
#define PSCLUSTER_SCHEDULER_JOB_TABLE_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/scheduler.pb.h"
#include "scheduler/progress_history.h"
#include "scheduler/store.h"

namespace pscluster::scheduler {

// One job as the scheduler holds it: the published v1::Job (persisted with its token, owner
// and latest shard map) and what the passes keep about it in memory only.
struct JobRecord {
  v1::Job job;
  std::string client_token;
  std::string owner;                // The identity that submitted it (quotas).
  // Parameter and optimizer-state bytes its servers held at the last poll (backups included;
  // polled only while a quota limits server memory).
  uint64_t server_bytes = 0;
  v1::ShardMap shard_map;           // Latest; empty until placed.
  int placement_attempts = 0;
  absl::Time next_attempt;          // Earliest next placement attempt.
  bool placement_pending = false;   // PLACING, calls to the nodes not yet made.
  bool progress_dirty = false;
  absl::Time last_persist;
  absl::Time last_poll;
  std::vector<uint32_t> server_waiting_for;
  // Ranks whose worker was lost, with why, for the control loop to hand over (not persisted:
  // after a restart the loop finds dead workers of running jobs again).
  struct LostRank {
    uint32_t rank = 0;
    std::string cause;
    bool avoid_node = false;  // Hand it to another worker than the one that ran it, if any.
  };
  std::vector<LostRank> lost_ranks;
  // A lost server whose shards' backups take over (replication > 1) instead of a rollback;
  // set with JOB_RECOVERING (not persisted: after a restart the job rolls back).
  std::string promote_lost;
  // (primary, backup) node ids: the primary's last status said it could not deliver copies
  // to that backup; the control loop drops it from the map (not persisted: the next poll
  // reports it again).
  std::set<std::pair<std::string, std::string>> unreachable_backups;
  // The map in force did not reach every server: the control loop sends it again.
  bool resend_map = false;
  // Ranks not yet told of the job's data shares (their UpdatePartition failed): BalanceData
  // tells them again.
  std::set<uint32_t> shares_unsent;
  absl::Time replace_backups_after;  // After a failed try: not before this.
  // Progress over time and events (Job.history): shown every published version of the job
  // (Persist, ReportProgress). In memory only.
  ProgressHistory history;
};

class JobTable {
 public:
  // Called once per failure, the first time a write fails (with the store's error), so that
  // the owner can log it, count it and stop serving. It must not call back into the table.
  using FailureListener = std::function<void(const absl::Status& cause)>;

  // REQUIRES: store and clock outlive the table.
  JobTable(Store* store, const Clock* clock, FailureListener on_failure);
  JobTable(const JobTable&) = delete;
  JobTable& operator=(const JobTable&) = delete;

  // ---- Lookup ----
  JobRecord* Find(const std::string& job_id);
  const JobRecord* Find(const std::string& job_id) const;
  // The job, or NOT_FOUND naming the job_id field: the answer of every RPC about an unknown job.
  absl::StatusOr<JobRecord*> FindOrError(const std::string& job_id);
  // The job submitted with `client_token` (non-empty), or nullptr.
  const JobRecord* FindByToken(const std::string& client_token) const;
  size_t size() const { return order_.size(); }

  // ---- Iteration, oldest first (`for (JobRecord& rec : table)`), or newest first ----
  template <typename Table, typename Record, typename It>
  class Iterator {
   public:
    Iterator(Table* table, It it) : table_(table), it_(it) {}
    Record& operator*() const { return table_->jobs_.find(*it_)->second; }
    Record* operator->() const { return &**this; }
    Iterator& operator++() {
      ++it_;
      return *this;
    }
    bool operator!=(const Iterator& o) const { return it_ != o.it_; }
    bool operator==(const Iterator& o) const { return it_ == o.it_; }

   private:
    Table* table_;
    It it_;
  };
  using iterator = Iterator<JobTable, JobRecord, std::vector<std::string>::const_iterator>;
  using const_iterator =
      Iterator<const JobTable, const JobRecord, std::vector<std::string>::const_iterator>;
  using reverse_iterator =
      Iterator<const JobTable, const JobRecord, std::vector<std::string>::const_reverse_iterator>;
  iterator begin() { return iterator(this, order_.begin()); }
  iterator end() { return iterator(this, order_.end()); }
  const_iterator begin() const { return const_iterator(this, order_.begin()); }
  const_iterator end() const { return const_iterator(this, order_.end()); }
  struct NewestFirstRange {
    reverse_iterator b, e;
    reverse_iterator begin() const { return b; }
    reverse_iterator end() const { return e; }
  };
  NewestFirstRange NewestFirst() const {
    return {reverse_iterator(this, order_.rbegin()), reverse_iterator(this, order_.rend())};
  }

  // ---- Changes ----
  // Writes a new job (rec.job.job_id() set, unknown to the table) and adds it as the newest.
  // On a failed write nothing is added and the sticky error is returned.
  absl::StatusOr<JobRecord*> Add(JobRecord rec);
  // Adds a job as the store holds it (no write; restore and reload). REQUIRES: unknown id.
  JobRecord& Load(JobRecord rec);
  // Forgets every job (before a reload from the store).
  void Clear();
  // Writes the job (and `map`, if given) before anything about it is published: marks its
  // progress clean and shows the new version to its history. A failure, or a store already
  // failed, returns the sticky error: the caller must then not send what it was about to send.
  [[nodiscard]] absl::Status Persist(JobRecord& rec, const v1::ShardMap* map = nullptr);

  // ---- The store's state ----
  // OK, or the sticky error: UNAVAILABLE naming the store and the write that failed.
  const absl::Status& error() const { return error_; }
  // Records a failed write (of the table's or of another record the owner keeps in the same
  // store, such as the nodes) as the sticky error; the listener hears of the first one.
  void Fail(const absl::Status& cause);
  // After the owner found the store working and reloaded the table.
  void ClearError() { error_ = absl::OkStatus(); }

 private:
  Store* const store_;
  const Clock* const clock_;
  const FailureListener on_failure_;
  absl::flat_hash_map<std::string, JobRecord> jobs_;
  std::vector<std::string> order_;  // Job ids, oldest first.
  absl::flat_hash_map<std::string, std::string> by_token_;
  absl::Status error_;
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_JOB_TABLE_H_
