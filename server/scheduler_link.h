// Registration with the scheduler and heartbeats (proto/scheduler.proto): RegisterNode with role
// ROLE_SERVER and the server's capacity, then Heartbeat with the node's load and per-shard load
// every heartbeat interval. NOT_FOUND (the scheduler forgot the node, e.g. after a restart)
// re-registers with the same address, which keeps the node id.
//
// Thread model: Register() runs on the caller's thread; heartbeats on one thread of their own
// until Stop().
#ifndef PSCLUSTER_SERVER_SCHEDULER_LINK_H_
#define PSCLUSTER_SERVER_SCHEDULER_LINK_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/channel.h"
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
  absl::Status RegisterOnce();
  void HeartbeatLoop();

  const SchedulerLinkOptions options_;
  PsHandler* const handler_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  mutable absl::Mutex mu_;
  std::string node_id_ ABSL_GUARDED_BY(mu_);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_SCHEDULER_LINK_H_
