// One leader among several schedulers, elected through etcd: a candidate holds a lease of
// `ttl_seconds` and leads while the election key exists under that lease; it is created only if
// absent (a transaction), so at most one candidate holds it. The key's create revision is the
// leader's term: every write of the etcd store is conditioned on it (etcd_store.h), which fences
// a deposed leader's late writes.
//
// A leader renews its lease every ttl/6 and gives up the leadership when no renewal has been
// confirmed for 2/3 of the ttl: it stops acting as leader before etcd can expire the lease and
// let another candidate in, even when it is cut off from etcd.
//
// Thread model: one thread drives Campaign() and KeepLeading(); Leader() and the accessors may
// be called from any thread.
#ifndef PSCLUSTER_SCHEDULER_LEADER_ELECTION_H_
#define PSCLUSTER_SCHEDULER_LEADER_ELECTION_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "scheduler/etcd_client.h"

namespace pscluster::scheduler {

struct LeaderElectionOptions {
  std::string key;    // The election key ("/pscluster/leader").
  std::string value;  // What followers learn of the leader: its host:port.
  int64_t ttl_seconds = 5;
  // How often a follower checks whether the key is free.
  absl::Duration poll = absl::Milliseconds(200);
};

class LeaderElection {
 public:
  // REQUIRES: etcd outlives the election.
  LeaderElection(EtcdClient* etcd, LeaderElectionOptions options);
  ~LeaderElection();

  // Blocks until this candidate leads; returns its term (the election key's create revision).
  // CANCELLED once `stop` is notified. etcd faults are retried (and logged once per outage).
  absl::StatusOr<int64_t> Campaign(absl::Notification* stop);

  // While leading: renews the lease until the leadership is lost or `stop` is notified; returns
  // why it ended ("stopped" for `stop`).
  std::string KeepLeading(absl::Notification* stop);

  // Gives the leadership up at once (revokes the lease, which deletes the key). Best effort.
  void Resign();

  // The value of the election key (the leader's address) as last seen; "" when none.
  std::string leader() const;
  int64_t term() const;
  // When the last confirmed renewal was sent (the lease lasts at least ttl past it).
  absl::Time last_renewal() const;
  const LeaderElectionOptions& options() const { return options_; }

 private:
  void SetLeader(const std::string& leader);

  EtcdClient* const etcd_;
  const LeaderElectionOptions options_;
  mutable absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  int64_t term_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_renewal_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_LEADER_ELECTION_H_
