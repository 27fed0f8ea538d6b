// The scheduler's registry of servers and workers: registration, leases and liveness, last
// reported load. Persists node records (not every heartbeat) through the Store so that a
// restarted scheduler still knows every node id.
//
// Liveness from the lease: a node is ALIVE while heartbeats arrive, SUSPECT once half a lease has
// passed without one, DEAD once a whole lease has; a heartbeat from a DEAD node gets NOT_FOUND
// and the node registers again (keeping its id). Nodes restored from the database start SUSPECT
// with a fresh lease: they have a whole lease to reach the restarted scheduler, and no new work
// is placed on them until they do.
//
// Thread-safe. Never calls out of itself except into the Store.
#ifndef PSCLUSTER_SCHEDULER_NODE_REGISTRY_H_
#define PSCLUSTER_SCHEDULER_NODE_REGISTRY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/scheduler.pb.h"
#include "scheduler/store.h"

namespace pscluster::scheduler {

struct RegistryOptions {
  absl::Duration lease = absl::Seconds(10);
};

struct Registration {
  std::string node_id;
  bool is_new = false;     // First time this node (id) was seen.
  bool restarted = false;  // Known node whose process changed (different pid): its work is lost.
};

class NodeRegistry {
 public:
  // REQUIRES: clock and store outlive the registry.
  NodeRegistry(const RegistryOptions& options, const Clock* clock, Store* store);

  // Loads the nodes of a previous run; live ones become SUSPECT with a fresh lease from now.
  absl::Status Restore();

  // INVALID_ARGUMENT names the bad field (node.role, node.address, ...).
  absl::StatusOr<Registration> Register(const v1::NodeInfo& info);
  // NOT_FOUND for an unknown node and for one whose lease expired or that left: it must register
  // again. INVALID_ARGUMENT for impossible load values.
  absl::Status Heartbeat(const v1::HeartbeatRequest& request);
  // NOT_FOUND for an unknown node. The node is kept, as LEFT.
  absl::Status Deregister(const std::string& node_id);

  // Sets a server's drain state and stores it (it survives a restart). NOT_FOUND for an
  // unknown node, INVALID_ARGUMENT for a worker; a store failure changes nothing.
  absl::Status SetDrain(const std::string& node_id, v1::NodeDrain drain);

  // Moves nodes to SUSPECT / DEAD by the age of their last heartbeat; returns the ids that
  // became DEAD now.
  std::vector<std::string> ExpireLeases();
  // Writes every node's record again (after the store failed); the first error stops it.
  absl::Status PersistAll();

  std::vector<v1::NodeStatus> Snapshot() const;
  std::optional<v1::NodeStatus> Get(const std::string& node_id) const;
  // Per-shard load last reported by the servers.
  std::vector<v1::ShardLoad> ShardLoads() const;
  // Live (ALIVE or SUSPECT) nodes of a role.
  std::vector<v1::NodeStatus> Live(v1::NodeRole role) const;

  absl::Duration lease() const { return options_.lease; }
  absl::Duration heartbeat_interval() const { return options_.lease / 3; }

 private:
  struct Node {
    v1::NodeStatus status;
    absl::Time last_heartbeat;
    std::vector<v1::ShardLoad> shard_loads;
  };
  static bool IsLive(const Node& n);
  std::string AddressKey(v1::NodeRole role, const std::string& address) const;

  const RegistryOptions options_;
  const Clock* const clock_;
  Store* const store_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Node> nodes_ ABSL_GUARDED_BY(mu_);
  // (role, address) -> node_id.
  absl::flat_hash_map<std::string, std::string> by_address_ ABSL_GUARDED_BY(mu_);
};

// Checks a "host:port" address with a port in 1..65535.
absl::Status CheckNodeAddress(absl::string_view address, absl::string_view field);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_NODE_REGISTRY_H_
