// A daemon's membership in the cluster, the same for servers and workers: register with the
// scheduler, heartbeat at the interval it suggests, register again when it answers NOT_FOUND (it
// forgot the node, e.g. after a restart on a new database; the node id is sent back so it is
// kept), deregister at the end.
//
// One retry policy: registration retries UNAVAILABLE and DEADLINE_EXCEEDED with exponential
// backoff (initial_backoff doubling up to max_backoff) until register_timeout, and fails at once
// on any other error (a refusal retrying does not change: a bad request, a node the scheduler
// does not authenticate). A failing heartbeat is logged once until heartbeats work again.
//
// Thread model: Register() runs on the caller's thread; heartbeats on one thread of the agent's
// own (StartHeartbeats, or StartAsync which also registers there) until Stop(). The calls are
// made from those threads only.
#ifndef PSCLUSTER_COMMON_NODE_AGENT_H_
#define PSCLUSTER_COMMON_NODE_AGENT_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/scheduler.pb.h"

namespace pscluster {

struct NodeAgentOptions {
  std::string component = "node";  // Logger name ("server", "worker").
  std::string scheduler;           // host:port, for messages.
  absl::Duration register_timeout = absl::Seconds(30);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  // Until the scheduler suggests one (RegisterNodeResponse.heartbeat_interval_ms, or a third of
  // its lease).
  absl::Duration heartbeat_interval = absl::Seconds(1);
};

// The RPCs, made by the daemon (its stub, its request contents). Each gets the node id the agent
// holds ("" before the first registration).
struct NodeAgentCalls {
  std::function<absl::StatusOr<v1::RegisterNodeResponse>(const std::string& node_id)> register_node;
  std::function<absl::Status(const std::string& node_id)> heartbeat;
  std::function<absl::Status(const std::string& node_id)> deregister;
};

class NodeAgent {
 public:
  NodeAgent(NodeAgentOptions options, NodeAgentCalls calls);
  ~NodeAgent();  // Stop().
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Registers under the retry policy. UNAVAILABLE "could not register with scheduler HOST:PORT
  // within 30s: ..." when it keeps failing; another error at once as the scheduler gave it;
  // CANCELLED when Stop() is called meanwhile.
  absl::Status Register();
  // Heartbeats on the agent's thread. REQUIRES: Register() succeeded.
  void StartHeartbeats();
  // Register() then heartbeats, both on the agent's thread; `on_fatal` is called there (once)
  // if registration fails.
  void StartAsync(std::function<void(absl::Status)> on_fatal);
  // Stops heartbeats (and a registration under way) and deregisters, best effort, once.
  void Stop();

  std::string node_id() const;
  absl::Duration heartbeat_interval() const;

 private:
  absl::Status RegisterOnce();
  void HeartbeatLoop();

  const NodeAgentOptions options_;
  const NodeAgentCalls calls_;
  mutable absl::Mutex mu_;
  std::string node_id_ ABSL_GUARDED_BY(mu_);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_NODE_AGENT_H_
