// Hot-shard rebalancing policy: given a job's shard map and the per-virtual-shard loads its
// servers reported, picks at most one virtual shard to move off the job's most loaded server.
//
// A shard's load is its bytes_per_sec plus its requests_per_sec times `bytes_per_request` (each
// request costs its server a fixed amount of work, parsing, lookups and wake-ups, whatever its
// size: a shard of many small sparse requests can be the hot one at few bytes/s). A server's
// load is the sum of the loads of the virtual shards it is primary of in the map (every server
// of the map counts, one with no shard at 0). Nothing moves when the hottest server
// is within `imbalance` times the mean, or within `min_bytes_per_sec` of the coldest. Otherwise
// targets are tried coldest first, skipping any that already backs up a shard of the hot server
// (the move seeds a fresh copy of the hot server's shards there); on the first target where some
// shard's move strictly lowers the pair's maximum load, the shard that lowers it most is chosen.
// Ties between servers of equal load break by node_id, between shards by the lower index.
//
// A pure function of its arguments: thread-safe, no I/O; applying the move (new primary, epoch
// + 1, copy_from) is the caller's job.
#ifndef PSCLUSTER_SCHEDULER_REBALANCE_H_
#define PSCLUSTER_SCHEDULER_REBALANCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "proto/common.pb.h"

namespace pscluster::scheduler {

struct RebalanceOptions {
  // A server is overloaded when its load exceeds this many times the mean over the job's servers.
  double imbalance = 1.5;
  // Below this difference (bytes/s) between the hottest and the coldest server nothing moves.
  double min_bytes_per_sec = 1 << 20;
  // What one request counts for, in bytes (0 = bytes/s alone). On loopback a server's fixed cost
  // per request (about 20 us: parse, table lookup, wake-up) is what moving some 32-64 KiB of
  // payload costs (docs/benchmarks.md, the 4 KiB round against bulk GB/s).
  double bytes_per_request = 32 << 10;
};

// One virtual shard to hand from its primary to another server of the same map.
struct ShardMove {
  uint32_t shard = 0;        // Virtual shard index.
  std::string from;          // node_id of its current primary (the hottest server).
  std::string to;            // node_id of the target server.
  double bytes_per_sec = 0;  // The shard's measured load (bytes/s, requests counted in).
  double from_load = 0;      // Load of `from` before the move (bytes/s, requests counted in).
  double to_load = 0;        // Load of `to` before the move (bytes/s, requests counted in).
};

// Picks at most one move of a hot virtual shard of `map`'s job, off its most loaded server, to a
// less loaded server of the same map, or nullopt when the job is balanced enough (or has fewer
// than 2 servers). Only `loads` of `map.job_id()` with shard < num_virtual_shards count; reports
// of the same shard are summed; reports with a non-finite or negative bytes_per_sec or
// requests_per_sec are ignored. Assignments
// whose primary is not in `map.servers()` are ignored.
// Servers in `no_target` (draining, drained or not alive) are never chosen as the target; they
// still count in the mean and may be the hot server. A shard never goes to a server that backs it
// (replication > 1): each copy stays on a server of its own.
std::optional<ShardMove> PickShardMove(const v1::ShardMap& map,
                                       const std::vector<v1::ShardLoad>& loads,
                                       const RebalanceOptions& options = {},
                                       const absl::flat_hash_set<std::string>& no_target = {});

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_REBALANCE_H_
