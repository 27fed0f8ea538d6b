// The worker's calls to the scheduler: registration, heartbeats, progress and shard maps. Every
// call has a deadline; errors come back as absl::Status naming the scheduler's address.
//
// Thread-safe: the heartbeat thread and the task thread call it concurrently.
#ifndef PSCLUSTER_WORKER_SCHEDULER_CLIENT_H_
#define PSCLUSTER_WORKER_SCHEDULER_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "proto/scheduler.grpc.pb.h"

namespace pscluster::worker {

class SchedulerClient {
 public:
  static absl::StatusOr<std::unique_ptr<SchedulerClient>> Create(const std::string& address,
                                                                 const ChannelOptions& options,
                                                                 absl::Duration timeout);

  const std::string& address() const { return address_; }

  absl::StatusOr<v1::RegisterNodeResponse> Register(const v1::NodeInfo& node);
  // NOT_FOUND means the scheduler does not know the node (register again).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  absl::Status Deregister(const std::string& node_id);
  // Returns whether the scheduler asks the task to stop.
  absl::StatusOr<bool> ReportProgress(const std::string& job_id, const v1::WorkerProgress& progress);
  absl::StatusOr<v1::ShardMap> GetShardMap(const std::string& job_id);

 private:
  SchedulerClient(std::string address, ChannelOptions options, absl::Duration timeout,
                  std::unique_ptr<v1::Scheduler::Stub> stub)
      : address_(std::move(address)), options_(std::move(options)), timeout_(timeout),
        stub_(std::move(stub)) {}

  const std::string address_;
  const ChannelOptions options_;
  const absl::Duration timeout_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_SCHEDULER_CLIENT_H_
