#include "scheduler/placement.h"

#include <algorithm>
#include <queue>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pscluster::scheduler {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Traffic that counts as much as hosting one more virtual shard.
constexpr double kBytesPerSecPerShard = 100e6;

double FreeGiB(const ServerCandidate& s) {
  uint64_t cap = s.memory_bytes == 0 ? kAssumedServerMemory : s.memory_bytes;
  uint64_t free = cap > s.memory_used_bytes ? cap - s.memory_used_bytes : 0;
  return std::max(static_cast<double>(free) / kGiB, 1.0 / 1024);  // At least 1 MiB.
}

double Pressure(const ServerCandidate& s) {
  return (s.shards_hosted + s.bytes_per_sec / kBytesPerSecPerShard) / FreeGiB(s);
}

// Deals items to servers one at a time, each to the server with the least (load + 1) / weight.
class LeastLoaded {
 public:
  void Add(int server, double weight, double load) {
    weights_.resize(std::max<size_t>(weights_.size(), server + 1), 1.0);
    loads_.resize(weights_.size(), 0.0);
    weights_[server] = weight;
    loads_[server] = load;
    heap_.push({(load + 1) / weight, server});
  }
  bool empty() const { return heap_.empty(); }
  // Items dealt to `server` by Take().
  int Taken(int server) const { return server < static_cast<int>(taken_.size()) ? taken_[server] : 0; }
  // Pops the least loaded server for which `ok(server)` holds, charges it one item and puts it
  // back. Returns -1 when no server qualifies.
  template <typename Ok>
  int Take(Ok ok) {
    std::vector<Entry> skipped;
    int chosen = -1;
    while (!heap_.empty()) {
      Entry e = heap_.top();
      heap_.pop();
      if (ok(e.server)) {
        chosen = e.server;
        break;
      }
      skipped.push_back(e);
    }
    for (const Entry& e : skipped) heap_.push(e);
    if (chosen >= 0) {
      taken_.resize(std::max<size_t>(taken_.size(), chosen + 1), 0);
      ++taken_[chosen];
      loads_[chosen] += 1;
      heap_.push({(loads_[chosen] + 1) / weights_[chosen], chosen});
    }
    return chosen;
  }

 private:
  struct Entry {
    double key;
    int server;
    bool operator<(const Entry& o) const {  // Min-heap on (key, server).
      return std::tie(key, server) > std::tie(o.key, o.server);
    }
  };
  std::priority_queue<Entry> heap_;
  std::vector<double> weights_;
  std::vector<double> loads_;
  std::vector<int> taken_;
};

std::string Names(const std::vector<std::string>& ids, size_t limit = 8) {
  if (ids.empty()) return "none";
  std::vector<std::string> shown(ids.begin(), ids.begin() + std::min(limit, ids.size()));
  std::string s = absl::StrJoin(shown, ", ");
  if (ids.size() > limit) absl::StrAppend(&s, ", ... (", ids.size() - limit, " more)");
  return s;
}

}  // namespace

absl::StatusOr<Placement> CapacityPlacement::Place(
    const PlacementRequest& req, const std::vector<ServerCandidate>& servers,
    const std::vector<WorkerCandidate>& workers) const {
  if (req.num_servers == 0 || req.num_workers == 0) {
    return absl::InvalidArgumentError("num_servers and num_workers must be >= 1");
  }
  if (req.num_virtual_shards < req.num_servers) {
    return absl::InvalidArgumentError(absl::StrCat("num_virtual_shards (", req.num_virtual_shards,
                                                   ") must be >= num_servers (", req.num_servers,
                                                   ")"));
  }
  uint32_t replication = std::max<uint32_t>(1, req.replication);
  if (replication > req.num_servers) {
    return absl::InvalidArgumentError(absl::StrCat("replication (", replication,
                                                   ") must be <= num_servers (", req.num_servers,
                                                   ")"));
  }

  // Workers: the capable ones, best fit first.
  std::vector<const WorkerCandidate*> capable;
  for (const WorkerCandidate& w : workers) {
    bool fits = req.gpus_per_worker > 0 ? w.gpus >= req.gpus_per_worker
                                        : (w.cpu_slots > 0 || w.gpus > 0);
    fits = fits && (!req.entrypoint || w.allow_entrypoints);
    if (fits) capable.push_back(&w);
  }
  if (capable.size() < req.num_workers) {
    std::string what = req.gpus_per_worker > 0
                           ? absl::StrCat(" with >= ", req.gpus_per_worker, " free GPUs")
                           : "";
    if (req.entrypoint) absl::StrAppend(&what, " that allow entrypoints");
    return absl::ResourceExhaustedError(absl::StrCat("needs ", req.num_workers, " idle workers",
                                                     what, ", ", capable.size(), " available"));
  }
  if (servers.size() < req.num_servers) {
    return absl::ResourceExhaustedError(absl::StrCat("needs ", req.num_servers, " servers, ",
                                                     servers.size(), " available"));
  }
  std::sort(capable.begin(), capable.end(), [](const WorkerCandidate* a, const WorkerCandidate* b) {
    // Fewest GPUs first (best fit for GPU jobs, CPU-only workers first for CPU jobs), then the
    // most CPU slots, then by id for a stable order.
    return std::make_tuple(a->gpus, -static_cast<int64_t>(a->cpu_slots), a->node_id) <
           std::make_tuple(b->gpus, -static_cast<int64_t>(b->cpu_slots), b->node_id);
  });

  // Servers: the least pressed.
  std::vector<int> order(servers.size());
  for (size_t i = 0; i < servers.size(); ++i) order[i] = i;
  auto less_pressed = [&](int a, int b) {
    double pa = Pressure(servers[a]), pb = Pressure(servers[b]);
    if (pa != pb) return pa < pb;
    return servers[a].node_id < servers[b].node_id;
  };
  if (req.num_servers < order.size()) {
    std::nth_element(order.begin(), order.begin() + req.num_servers, order.end(), less_pressed);
    order.resize(req.num_servers);
  }
  std::sort(order.begin(), order.end(), less_pressed);

  Placement out;
  v1::ShardMap& map = out.shard_map;
  map.set_job_id(req.job_id);
  map.set_epoch(1);
  map.set_num_virtual_shards(req.num_virtual_shards);
  LeastLoaded dealer;
  for (size_t i = 0; i < order.size(); ++i) {
    const ServerCandidate& s = servers[order[i]];
    out.servers.push_back(s.node_id);
    v1::ServerEndpoint* ep = map.add_servers();
    ep->set_node_id(s.node_id);
    ep->set_address(s.address);
    // Every chosen server gets at least one shard: shard i < num_servers goes to server i.
    dealer.Add(i, FreeGiB(s), 1);
  }
  const uint32_t n = req.num_servers;
  for (uint32_t shard = 0; shard < req.num_virtual_shards; ++shard) {
    int primary = shard < n ? static_cast<int>(shard) : dealer.Take([](int) { return true; });
    v1::ShardAssignment* a = map.add_assignments();
    a->set_shard(shard);
    a->set_primary(out.servers[primary]);
    for (uint32_t b = 1; b < replication; ++b) a->add_backups(out.servers[(primary + b) % n]);
  }
  for (uint32_t r = 0; r < req.num_workers; ++r) out.workers.push_back(capable[r]->node_id);
  return out;
}

absl::StatusOr<v1::ShardMap> CapacityPlacement::Replace(
    const v1::ShardMap& map, const std::string& dead,
    const std::vector<ServerCandidate>& live) const {
  // Candidates: live servers other than `dead`; the map's own servers first.
  absl::flat_hash_set<std::string> in_map;
  for (const v1::ServerEndpoint& ep : map.servers()) in_map.insert(ep.node_id());
  std::vector<const ServerCandidate*> cands;
  bool any_in_map = false;
  for (const ServerCandidate& s : live) {
    if (s.node_id == dead) continue;
    if (in_map.contains(s.node_id)) any_in_map = true;
  }
  for (const ServerCandidate& s : live) {
    if (s.node_id == dead) continue;
    if (!any_in_map || in_map.contains(s.node_id)) cands.push_back(&s);
  }
  if (cands.empty()) {
    return absl::UnavailableError(absl::StrCat("no live server is left to take the shards of ",
                                               dead, " for job ", map.job_id()));
  }
  absl::flat_hash_map<std::string, int> index;
  for (size_t i = 0; i < cands.size(); ++i) index[cands[i]->node_id] = i;
  std::vector<double> primaries(cands.size(), 0);
  for (const v1::ShardAssignment& a : map.assignments()) {
    auto it = index.find(a.primary());
    if (it != index.end()) primaries[it->second] += 1;
  }
  LeastLoaded dealer;
  for (size_t i = 0; i < cands.size(); ++i) {
    dealer.Add(i, FreeGiB(*cands[i]), primaries[i] + cands[i]->shards_hosted);
  }

  v1::ShardMap out = map;
  out.set_epoch(map.epoch() + 1);
  for (v1::ShardAssignment& a : *out.mutable_assignments()) {
    bool lost_primary = a.primary() == dead;
    bool lost_backup = false;
    for (const std::string& b : a.backups()) lost_backup = lost_backup || b == dead;
    if (!lost_primary && !lost_backup) continue;  // Untouched: the common case.
    std::vector<std::string> backups;
    for (const std::string& b : a.backups()) {
      if (b != dead) backups.push_back(b);
    }
    if (lost_primary) {
      if (!backups.empty()) {
        a.set_primary(backups.front());
        backups.erase(backups.begin());
        lost_backup = true;  // The promoted backup needs a replacement.
      } else {
        int s = dealer.Take([](int) { return true; });
        a.set_primary(cands[s]->node_id);
      }
    }
    if (lost_backup) {
      absl::flat_hash_set<std::string> holders(backups.begin(), backups.end());
      holders.insert(a.primary());
      int s = dealer.Take([&](int i) { return !holders.contains(cands[i]->node_id); });
      if (s >= 0) backups.push_back(cands[s]->node_id);  // Else: fewer copies than asked.
    }
    a.clear_backups();
    for (const std::string& b : backups) a.add_backups(b);
  }

  // Endpoints: the map's servers but the dead one (each keeps its shards), plus those that took
  // shards now.
  absl::flat_hash_set<std::string> named;
  absl::flat_hash_map<std::string, std::string> address;
  for (const v1::ServerEndpoint& ep : map.servers()) {
    if (ep.node_id() == dead) continue;
    named.insert(ep.node_id());
    address[ep.node_id()] = ep.address();
  }
  for (size_t i = 0; i < cands.size(); ++i) {
    if (dealer.Taken(i) > 0) {
      named.insert(cands[i]->node_id);
      address[cands[i]->node_id] = cands[i]->address;
    }
  }
  out.clear_servers();
  std::vector<std::string> ids(named.begin(), named.end());
  std::sort(ids.begin(), ids.end());
  for (const std::string& id : ids) {
    v1::ServerEndpoint* ep = out.add_servers();
    ep->set_node_id(id);
    ep->set_address(address[id]);
  }
  return out;
}

absl::Status CheckShardMap(const v1::ShardMap& map) {
  if (map.num_virtual_shards() == 0) {
    return absl::InvalidArgumentError("shard map: num_virtual_shards is 0");
  }
  if (map.assignments_size() != static_cast<int>(map.num_virtual_shards())) {
    return absl::InvalidArgumentError(absl::StrCat("shard map: ", map.assignments_size(),
                                                   " assignments for ", map.num_virtual_shards(),
                                                   " virtual shards"));
  }
  absl::flat_hash_map<std::string, std::string> endpoints;
  for (const v1::ServerEndpoint& ep : map.servers()) {
    if (ep.address().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard map: server ", ep.node_id(), " has no address"));
    }
    endpoints[ep.node_id()] = ep.address();
  }
  std::vector<std::string> missing;
  for (int i = 0; i < map.assignments_size(); ++i) {
    const v1::ShardAssignment& a = map.assignments(i);
    if (a.shard() != static_cast<uint32_t>(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard map: assignment ", i, " is for shard ", a.shard()));
    }
    absl::flat_hash_set<std::string> holders = {a.primary()};
    if (!endpoints.contains(a.primary())) missing.push_back(a.primary());
    for (const std::string& b : a.backups()) {
      if (!holders.insert(b).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("shard map: shard ", i, " names server ", b, " twice"));
      }
      if (!endpoints.contains(b)) missing.push_back(b);
    }
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard map: servers without an endpoint: ", Names(missing)));
  }
  return absl::OkStatus();
}

}  // namespace pscluster::scheduler
