#include "scheduler/node_registry.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pscluster::scheduler {
namespace {

constexpr size_t kMaxText = 1024;
constexpr int kMaxShardLoads = 1 << 20;

bool FiniteNonNegative(double v) { return std::isfinite(v) && v >= 0; }

absl::Status CheckLoad(const v1::Load& load, absl::string_view field) {
  if (!FiniteNonNegative(load.bytes_per_sec())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".bytes_per_sec: must be a finite number >= 0"));
  }
  if (!FiniteNonNegative(load.requests_per_sec())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".requests_per_sec: must be a finite number >= 0"));
  }
  return absl::OkStatus();
}

int64_t UnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

}  // namespace

absl::Status CheckNodeAddress(absl::string_view address, absl::string_view field) {
  size_t colon = address.rfind(':');
  if (address.empty() || colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", address, "' must be host:port"));
  }
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", address,
        "' needs a port in 1-65535 (a daemon started on port 0 registers the port it got)"));
  }
  if (address.size() > kMaxText) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": longer than ", kMaxText, " bytes"));
  }
  return absl::OkStatus();
}

NodeRegistry::NodeRegistry(const RegistryOptions& options, const Clock* clock, Store* store)
    : options_(options), clock_(clock), store_(store) {}

bool NodeRegistry::IsLive(const Node& n) {
  return n.status.state() == v1::NODE_ALIVE || n.status.state() == v1::NODE_SUSPECT;
}

std::string NodeRegistry::AddressKey(v1::NodeRole role, const std::string& address) const {
  return absl::StrCat(static_cast<int>(role), "/", address);
}

absl::Status NodeRegistry::Restore() {
  auto nodes = store_->LoadNodes();
  if (!nodes.ok()) return nodes.status();
  absl::Time now = clock_->Now();
  absl::MutexLock l(&mu_);
  for (v1::NodeStatus& s : *nodes) {
    Node n;
    n.status = std::move(s);
    if (IsLive(n)) {
      // Suspect until it is heard from (no new work goes there), with a fresh lease to reach
      // the restarted scheduler.
      n.status.set_state(v1::NODE_SUSPECT);
      n.last_heartbeat = now;
      n.status.set_last_heartbeat_unix_ms(UnixMs(now));
    } else {
      n.last_heartbeat = absl::FromUnixMillis(n.status.last_heartbeat_unix_ms());
    }
    n.status.clear_jobs();
    std::string id = n.status.info().node_id();
    by_address_[AddressKey(n.status.info().role(), n.status.info().address())] = id;
    nodes_[id] = std::move(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<Registration> NodeRegistry::Register(const v1::NodeInfo& info) {
  if (info.role() != v1::ROLE_SERVER && info.role() != v1::ROLE_WORKER) {
    return absl::InvalidArgumentError(
        "node.role: must be ROLE_SERVER or ROLE_WORKER (only servers and workers register)");
  }
  absl::Status s = CheckNodeAddress(info.address(), "node.address");
  if (!s.ok()) return s;
  if (info.hostname().size() > kMaxText || info.version().size() > kMaxText ||
      info.node_id().size() > kMaxText) {
    return absl::InvalidArgumentError(
        absl::StrCat("node: node_id, hostname and version must be at most ", kMaxText, " bytes"));
  }
  absl::Time now = clock_->Now();
  absl::MutexLock l(&mu_);
  Registration out;
  std::string id;
  // The id the node remembers wins when we know it; otherwise its address finds it.
  auto known = info.node_id().empty() ? nodes_.end() : nodes_.find(info.node_id());
  if (known != nodes_.end()) {
    if (known->second.status.info().role() != info.role()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node.node_id: ", info.node_id(), " is registered with another role; register with an "
          "empty node_id"));
    }
    id = known->first;
  } else {
    auto by_addr = by_address_.find(AddressKey(info.role(), info.address()));
    if (by_addr != by_address_.end()) id = by_addr->second;
  }
  if (id.empty()) {
    auto n = store_->NextId(info.role() == v1::ROLE_SERVER ? "server" : "worker");
    if (!n.ok()) return n.status();
    id = absl::StrCat(info.role() == v1::ROLE_SERVER ? "server-" : "worker-", *n);
    out.is_new = true;
  }
  Node& node = nodes_[id];
  if (!out.is_new) {
    const v1::NodeInfo& old = node.status.info();
    out.restarted = old.pid() != 0 && info.pid() != 0 && old.pid() != info.pid();
    if (old.address() != info.address()) {
      by_address_.erase(AddressKey(old.role(), old.address()));
    }
  }
  // Another record that still claims this address belongs to a process that is gone.
  auto prev = by_address_.find(AddressKey(info.role(), info.address()));
  if (prev != by_address_.end() && prev->second != id) {
    auto other = nodes_.find(prev->second);
    if (other != nodes_.end() && IsLive(other->second)) {
      other->second.status.set_state(v1::NODE_DEAD);
      absl::Status ps = store_->PutNode(other->second.status);
      if (!ps.ok()) Logger("scheduler")->warn("{}", ps);
    }
  }
  by_address_[AddressKey(info.role(), info.address())] = id;
  *node.status.mutable_info() = info;
  node.status.mutable_info()->set_node_id(id);
  node.status.set_state(v1::NODE_ALIVE);
  node.status.set_last_heartbeat_unix_ms(UnixMs(now));
  node.last_heartbeat = now;
  s = store_->PutNode(node.status);
  if (!s.ok()) return s;
  out.node_id = id;
  return out;
}

absl::Status NodeRegistry::Heartbeat(const v1::HeartbeatRequest& req) {
  absl::Status s = CheckLoad(req.load(), "load");
  if (!s.ok()) return s;
  if (req.shard_loads_size() > kMaxShardLoads) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_loads: more than ", kMaxShardLoads, " entries"));
  }
  for (int i = 0; i < req.shard_loads_size(); ++i) {
    s = CheckLoad(req.shard_loads(i).load(), absl::StrCat("shard_loads[", i, "].load"));
    if (!s.ok()) return s;
  }
  absl::Time now = clock_->Now();
  absl::MutexLock l(&mu_);
  auto it = nodes_.find(req.node_id());
  if (it == nodes_.end()) {
    return absl::NotFoundError(
        absl::StrCat("node_id: '", req.node_id(), "' is not registered; register again"));
  }
  Node& n = it->second;
  if (!IsLive(n)) {
    return absl::NotFoundError(absl::StrCat(
        "node_id: ", req.node_id(),
        n.status.state() == v1::NODE_LEFT ? " deregistered" : "'s lease expired",
        "; register again"));
  }
  n.status.set_state(v1::NODE_ALIVE);
  n.last_heartbeat = now;
  n.status.set_last_heartbeat_unix_ms(UnixMs(now));
  *n.status.mutable_load() = req.load();
  n.shard_loads.assign(req.shard_loads().begin(), req.shard_loads().end());
  return absl::OkStatus();
}

absl::Status NodeRegistry::Deregister(const std::string& node_id) {
  absl::MutexLock l(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("node_id: '", node_id, "' is not registered"));
  }
  it->second.status.set_state(v1::NODE_LEFT);
  it->second.shard_loads.clear();
  return store_->PutNode(it->second.status);
}

absl::Status NodeRegistry::SetDrain(const std::string& node_id, v1::NodeDrain drain) {
  absl::MutexLock l(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("node_id: '", node_id, "' is not registered"));
  }
  if (it->second.status.info().role() != v1::ROLE_SERVER) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_id: ", node_id, " is a worker; only servers are drained"));
  }
  if (it->second.status.drain() == drain) return absl::OkStatus();
  v1::NodeStatus next = it->second.status;
  next.set_drain(drain);
  absl::Status s = store_->PutNode(next);
  if (!s.ok()) return s;  // Not stored: not changed either.
  it->second.status = std::move(next);
  return absl::OkStatus();
}

absl::Status NodeRegistry::PersistAll() {
  absl::MutexLock l(&mu_);
  for (const auto& [id, n] : nodes_) {
    absl::Status s = store_->PutNode(n.status);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::vector<std::string> NodeRegistry::ExpireLeases() {
  absl::Time now = clock_->Now();
  std::vector<std::string> died;
  absl::MutexLock l(&mu_);
  for (auto& [id, n] : nodes_) {
    if (!IsLive(n)) continue;
    absl::Duration age = now - n.last_heartbeat;
    if (age > options_.lease) {
      n.status.set_state(v1::NODE_DEAD);
      n.shard_loads.clear();
      absl::Status s = store_->PutNode(n.status);
      if (!s.ok()) Logger("scheduler")->warn("recording that {} died: {}", id, s);
      died.push_back(id);
    } else if (age > options_.lease / 2) {
      n.status.set_state(v1::NODE_SUSPECT);
    }
  }
  return died;
}

std::vector<v1::NodeStatus> NodeRegistry::Snapshot() const {
  absl::MutexLock l(&mu_);
  std::vector<v1::NodeStatus> out;
  out.reserve(nodes_.size());
  for (const auto& [id, n] : nodes_) out.push_back(n.status);
  return out;
}

std::optional<v1::NodeStatus> NodeRegistry::Get(const std::string& node_id) const {
  absl::MutexLock l(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return std::nullopt;
  return it->second.status;
}

std::vector<v1::ShardLoad> NodeRegistry::ShardLoads() const {
  absl::MutexLock l(&mu_);
  std::vector<v1::ShardLoad> out;
  for (const auto& [id, n] : nodes_) out.insert(out.end(), n.shard_loads.begin(), n.shard_loads.end());
  return out;
}

std::vector<v1::NodeStatus> NodeRegistry::Live(v1::NodeRole role) const {
  absl::MutexLock l(&mu_);
  std::vector<v1::NodeStatus> out;
  for (const auto& [id, n] : nodes_) {
    if (IsLive(n) && n.status.info().role() == role) out.push_back(n.status);
  }
  return out;
}

}  // namespace pscluster::scheduler
