#include "scheduler/rebalance.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace pscluster::scheduler {

std::optional<ShardMove> PickShardMove(const v1::ShardMap& map,
                                       const std::vector<v1::ShardLoad>& loads,
                                       const RebalanceOptions& options,
                                       const absl::flat_hash_set<std::string>& no_target) {
  const uint32_t num_shards = map.num_virtual_shards();
  absl::flat_hash_map<uint32_t, double> shard_load;
  for (const v1::ShardLoad& report : loads) {
    const double bytes = report.load().bytes_per_sec();
    const double requests = report.load().requests_per_sec();
    if (report.job_id() != map.job_id() || report.shard() >= num_shards ||
        !std::isfinite(bytes) || bytes < 0 || !std::isfinite(requests) || requests < 0) {
      continue;
    }
    shard_load[report.shard()] += bytes + requests * std::max(0.0, options.bytes_per_request);
  }

  std::map<std::string, double> server_load;  // node_id -> load; ordered for determinism.
  for (const v1::ServerEndpoint& server : map.servers()) server_load.emplace(server.node_id(), 0);
  if (server_load.size() < 2) return std::nullopt;

  // Attribute each shard to its primary; the first assignment of a shard wins.
  absl::flat_hash_set<uint32_t> assigned;
  std::vector<std::pair<uint32_t, const v1::ShardAssignment*>> by_shard;
  for (const v1::ShardAssignment& a : map.assignments()) {
    auto server = server_load.find(a.primary());
    if (a.shard() >= num_shards || server == server_load.end() ||
        !assigned.insert(a.shard()).second) {
      continue;
    }
    auto load = shard_load.find(a.shard());
    if (load != shard_load.end()) server->second += load->second;
    by_shard.emplace_back(a.shard(), &a);
  }

  // Coldest first; equal loads by node_id.
  std::vector<std::pair<double, std::string>> order;
  double total = 0;
  for (const auto& [id, load] : server_load) {
    order.emplace_back(load, id);
    total += load;
  }
  std::sort(order.begin(), order.end());
  const double from_load = order.back().first;
  const std::string& hot = std::find_if(order.begin(), order.end(), [&](const auto& s) {
                             return s.first == from_load;
                           })->second;
  const double mean = total / static_cast<double>(order.size());
  if (!(from_load > options.imbalance * mean) ||
      !(from_load - order.front().first >= options.min_bytes_per_sec)) {
    return std::nullopt;
  }

  // The hot server's shards with load, by index, each with the servers holding a copy of it.
  std::sort(by_shard.begin(), by_shard.end());
  struct HotShard {
    uint32_t shard;
    double load;
    const v1::ShardAssignment* a;
  };
  std::vector<HotShard> hot_shards;
  for (const auto& [shard, a] : by_shard) {
    if (a->primary() != hot) continue;
    auto load = shard_load.find(shard);
    if (load != shard_load.end() && load->second > 0) {
      hot_shards.push_back(HotShard{shard, load->second, a});
    }
  }

  for (const auto& [to_load, to] : order) {
    if (to == hot || no_target.contains(to)) continue;
    std::optional<ShardMove> best;
    double best_max = 0;
    for (const auto& [shard, l, a] : hot_shards) {
      // A server with a copy of the shard already (a backup) cannot take another one.
      if (std::find(a->backups().begin(), a->backups().end(), to) != a->backups().end()) continue;
      if (!(to_load + l < from_load)) continue;
      const double pair_max = std::max(from_load - l, to_load + l);
      if (!best || pair_max < best_max) {
        best = ShardMove{shard, hot, to, l, from_load, to_load};
        best_max = pair_max;
      }
    }
    if (best) return best;
  }
  return std::nullopt;
}

}  // namespace pscluster::scheduler
