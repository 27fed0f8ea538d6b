// Placement policy: which servers hold a job's virtual shards and which workers run its tasks.
//
// The default policy (CapacityPlacement):
//  * servers are ranked by pressure = (virtual shards already hosted + measured bytes/s over
//    100 MB/s) per GiB of free memory; the num_servers least pressed are chosen;
//  * virtual shards are dealt to the chosen servers in proportion to their free memory (a server
//    with twice the free memory gets about twice the shards), each shard's replication - 1
//    backups on the next servers of the chosen list, never on its primary;
//  * tasks go to idle workers by free GPUs: a GPU job takes the workers whose GPU count fits
//    best, a CPU job takes CPU-only workers first (keeping GPUs free), then by CPU slots.
// Re-placing after a server dies moves only the shards that server held: a backup is promoted
// where one exists, otherwise the shard goes to the least loaded remaining server.
#ifndef PSCLUSTER_SCHEDULER_PLACEMENT_H_
#define PSCLUSTER_SCHEDULER_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/common.pb.h"

namespace pscluster::scheduler {

// Memory assumed for a server that registered without a capacity.
inline constexpr uint64_t kAssumedServerMemory = uint64_t{1} << 30;

struct ServerCandidate {
  std::string node_id;
  std::string address;
  uint64_t memory_bytes = 0;       // Registered capacity (0 = unknown).
  uint64_t memory_used_bytes = 0;  // Last reported use.
  double bytes_per_sec = 0;        // Last reported traffic.
  uint32_t shards_hosted = 0;      // Virtual shards of other running jobs held there now.
};

struct WorkerCandidate {
  std::string node_id;
  std::string address;
  uint32_t gpus = 0;       // Free GPUs.
  uint32_t cpu_slots = 0;  // Free CPU task slots.
  bool allow_entrypoints = false;  // Runs user commands (ps_worker --allow_entrypoints).
};

struct PlacementRequest {
  std::string job_id;
  uint32_t num_servers = 1;
  uint32_t num_workers = 1;
  uint32_t gpus_per_worker = 0;
  uint32_t num_virtual_shards = 64;
  uint32_t replication = 1;
  bool entrypoint = false;  // The job runs the user's command: only on workers that allow it.
};

struct Placement {
  v1::ShardMap shard_map;            // Epoch 1, one assignment per virtual shard.
  std::vector<std::string> servers;  // node_ids of the chosen servers.
  std::vector<std::string> workers;  // node_ids of the chosen workers, by rank.
};

class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;

  // `servers` are the live servers, `workers` the live idle workers. RESOURCE_EXHAUSTED says
  // what is missing ("needs 3 servers, 2 available"); INVALID_ARGUMENT for an impossible
  // request (0 servers, fewer shards than servers, replication above num_servers).
  virtual absl::StatusOr<Placement> Place(const PlacementRequest& request,
                                          const std::vector<ServerCandidate>& servers,
                                          const std::vector<WorkerCandidate>& workers) const = 0;

  // The map without server `dead` (epoch + 1). `live` are the servers that may take shards
  // (the map's other servers among them). UNAVAILABLE when no live server is left.
  virtual absl::StatusOr<v1::ShardMap> Replace(const v1::ShardMap& map, const std::string& dead,
                                               const std::vector<ServerCandidate>& live) const = 0;
};

class CapacityPlacement final : public PlacementPolicy {
 public:
  absl::StatusOr<Placement> Place(const PlacementRequest& request,
                                  const std::vector<ServerCandidate>& servers,
                                  const std::vector<WorkerCandidate>& workers) const override;
  absl::StatusOr<v1::ShardMap> Replace(const v1::ShardMap& map, const std::string& dead,
                                       const std::vector<ServerCandidate>& live) const override;
};

// Checks the invariants every shard map must keep: one assignment per shard in order, each
// primary and backup listed in `servers` with an address, no shard with a repeated server.
absl::Status CheckShardMap(const v1::ShardMap& map);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_PLACEMENT_H_
