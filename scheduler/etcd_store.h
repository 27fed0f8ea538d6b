// The scheduler's durable state in etcd (beside the SQLite store, store.h): for schedulers that
// survive losing their machine, one of several elected leader (leader_election.h). Keys, under
// a prefix ("/pscluster/"):
//   counters/NAME   decimal value of a counter (NextId)
//   cluster_key     the cluster's secret key (32 bytes)
//   nodes/NODE_ID   v1.NodeStatus
//   jobs/JOB_ID     v1.StoredJobRecord (etcd_store.proto): job, token, owner, latest shard map
// Every write is one etcd transaction conditioned on the election key still having this
// leader's create revision (its term): once another scheduler leads, or after Depose(), every
// write of this store fails with FAILED_PRECONDITION and changes nothing. Reads are etcd's
// linearizable reads.
//
// Thread-safe: writes are serialized (each is a read-modify-write of its key).
#ifndef PSCLUSTER_SCHEDULER_ETCD_STORE_H_
#define PSCLUSTER_SCHEDULER_ETCD_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "scheduler/etcd_client.h"
#include "scheduler/store.h"

namespace pscluster::scheduler {

class EtcdStore final : public Store {
 public:
  // `prefix` ends with '/'. `election_key` and `term`: the leadership the writes are fenced by.
  // REQUIRES: etcd outlives the store.
  EtcdStore(EtcdClient* etcd, std::string prefix, std::string election_key, int64_t term);
  // The same over a client of its own, which Depose() closes.
  EtcdStore(std::unique_ptr<EtcdClient> etcd, std::string prefix, std::string election_key,
            int64_t term);

  // The leadership is lost: every later read and write fails at once, and (with a client of its
  // own) the calls in flight are cancelled.
  void Depose();

  absl::StatusOr<uint64_t> NextId(absl::string_view counter) override;
  // The revision of a fenced write of `<prefix>epochs/<job_id>`: a number no earlier write in
  // etcd has (so above every epoch this or an earlier leader gave), and that a deposed leader
  // cannot get (its write fails). At least current + 1.
  absl::StatusOr<uint64_t> NextEpoch(absl::string_view job_id, uint64_t current) override;
  absl::StatusOr<std::string> ClusterKey() override;
  absl::Status PutNode(const v1::NodeStatus& node) override;
  absl::StatusOr<std::vector<v1::NodeStatus>> LoadNodes() override;
  absl::Status PutJob(const v1::Job& job, absl::string_view client_token,
                      const v1::ShardMap* map = nullptr, absl::string_view owner = "") override;
  absl::StatusOr<std::vector<StoredJob>> LoadJobs() override;
  const std::string& path() const override { return path_; }

 private:
  // Applies `ops` if the election key has this term and each (key, mod revision) in `expect`
  // still holds (mod revision 0 = the key does not exist). ABORTED when an `expect` failed (the
  // caller reads again), FAILED_PRECONDITION when the leadership is gone.
  // *revision (when given): the revision the applied transaction created.
  absl::Status FencedTxn(const std::vector<std::pair<std::string, int64_t>>& expect,
                         std::vector<etcdserverpb::RequestOp> ops, absl::string_view what,
                         int64_t* revision = nullptr);
  absl::Status NotLeader(absl::string_view what) const;

  std::unique_ptr<EtcdClient> own_;
  EtcdClient* const etcd_;
  const std::string prefix_;
  const std::string election_key_;
  const int64_t term_;
  const std::string path_;
  std::atomic<bool> deposed_{false};
  absl::Mutex write_mu_;  // One read-modify-write at a time.
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_ETCD_STORE_H_
