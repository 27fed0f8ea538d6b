// Running a worker without a scheduler (tests, benchmarks, `ps_worker --servers=...`): a shard
// map that spreads the virtual shards round-robin over a given list of servers. Every worker of
// a standalone job computes the same map from the same list.
#ifndef PSCLUSTER_WORKER_STANDALONE_H_
#define PSCLUSTER_WORKER_STANDALONE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/common.pb.h"

namespace pscluster::worker {

// Servers are named "server-<i>" in list order. INVALID_ARGUMENT for an empty list or an
// address that is not host:port.
absl::StatusOr<v1::ShardMap> RoundRobinShardMap(const std::string& job_id,
                                                const std::vector<std::string>& servers,
                                                uint32_t num_virtual_shards);

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_STANDALONE_H_
