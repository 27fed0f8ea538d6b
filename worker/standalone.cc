#include "worker/standalone.h"

#include "absl/strings/str_cat.h"
#include "common/sharding.h"

namespace pscluster::worker {

absl::StatusOr<v1::ShardMap> RoundRobinShardMap(const std::string& job_id,
                                                const std::vector<std::string>& servers,
                                                uint32_t num_virtual_shards) {
  if (servers.empty()) return absl::InvalidArgumentError("--servers: no server given");
  for (const std::string& s : servers) {
    size_t colon = s.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) {
      return absl::InvalidArgumentError(absl::StrCat("--servers: '", s, "' is not host:port"));
    }
  }
  uint32_t n = num_virtual_shards > 0 ? num_virtual_shards : kDefaultVirtualShards;
  v1::ShardMap map;
  map.set_job_id(job_id);
  map.set_epoch(1);
  map.set_num_virtual_shards(n);
  for (size_t i = 0; i < servers.size(); ++i) {
    auto* ep = map.add_servers();
    ep->set_node_id(absl::StrCat("server-", i));
    ep->set_address(servers[i]);
  }
  for (uint32_t s = 0; s < n; ++s) {
    auto* a = map.add_assignments();
    a->set_shard(s);
    a->set_primary(absl::StrCat("server-", s % servers.size()));
  }
  return map;
}

}  // namespace pscluster::worker
