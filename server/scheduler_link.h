// The server's membership (common/node_agent.h, the policy every node follows): RegisterNode with
// role ROLE_SERVER and the server's capacity, then Heartbeat with the node's load and per-shard
// load every heartbeat interval; registered again on NOT_FOUND.
//
// Thread model: Start() registers on the caller's thread; heartbeats run on the agent's thread
// until Stop().
#ifndef PSCLUSTER_SERVER_SCHEDULER_LINK_H_
#define PSCLUSTER_SERVER_SCHEDULER_LINK_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "common/node_agent.h"
#include "proto/scheduler.grpc.pb.h"
#include "server/ps_handler.h"

namespace pscluster {

struct SchedulerLinkOptions {
  std::string scheduler;          // host:port of ps_scheduler.
  std::string advertise_address;  // host:port workers reach this server at.
  uint64_t memory_bytes = 0;      // Capacity reported.
  ChannelOptions channel;
  absl::Duration call_timeout = absl::Seconds(5);
  // How long Register() keeps trying before giving up (a retryable fault: exit 138).
  absl::Duration register_timeout = absl::Seconds(30);
  std::string version = "pscluster-server";
};

class SchedulerLink {
 public:
  // REQUIRES: handler outlives the link.
  SchedulerLink(SchedulerLinkOptions options, PsHandler* handler);
  ~SchedulerLink();

  // Registers (retrying until register_timeout) and starts heartbeats. Sets the handler's node
  // id. UNAVAILABLE names the scheduler address when it cannot be reached.
  absl::Status Start();
  // Stops heartbeats and deregisters (best effort).
  void Stop();

  std::string node_id() const;

 private:
  absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(const std::string& node_id);
  absl::Status Heartbeat(const std::string& node_id);
  absl::Status Deregister(const std::string& node_id);

  const SchedulerLinkOptions options_;
  PsHandler* const handler_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  std::unique_ptr<NodeAgent> agent_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_SCHEDULER_LINK_H_
