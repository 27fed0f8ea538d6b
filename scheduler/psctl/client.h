// psctl's connection to the scheduler: every call has the --timeout deadline, and a scheduler
// that cannot be reached is reported with its address and the deadline, not as a raw gRPC error.
#ifndef PSCLUSTER_SCHEDULER_PSCTL_CLIENT_H_
#define PSCLUSTER_SCHEDULER_PSCTL_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "proto/scheduler.grpc.pb.h"

namespace pscluster::psctl {

struct ClientOptions {
  std::string address = "127.0.0.1:7070";     // Scheduler host:port.
  absl::Duration timeout = absl::Seconds(10);  // Deadline of each call.
  ChannelOptions channel;                      // TLS and bearer token.
};

class SchedulerClient {
 public:
  static absl::StatusOr<std::unique_ptr<SchedulerClient>> Connect(const ClientOptions& options);

  absl::StatusOr<v1::SubmitJobResponse> SubmitJob(const v1::SubmitJobRequest& req);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(bool include_finished);
  // `from` empty: the shard's primary moves; else the backup that server holds.
  absl::StatusOr<v1::MoveShardResponse> MoveShard(const std::string& job_id, uint32_t shard,
                                                  const std::string& to,
                                                  const std::string& from = "");
  absl::StatusOr<v1::ScaleJobResponse> ScaleJob(const std::string& job_id, uint32_t servers);
  absl::StatusOr<v1::DrainServerResponse> DrainServer(const std::string& node_id);
  absl::StatusOr<v1::UndrainServerResponse> UndrainServer(const std::string& node_id);
  // `dir` empty: the job's checkpoint_dir.
  absl::StatusOr<v1::CheckpointJobResponse> CheckpointJob(const std::string& job_id,
                                                          const std::string& dir);
  // Waits at least two minutes whatever --timeout says (the worker writes the whole model).
  absl::StatusOr<v1::ExportJobResponse> ExportJob(const std::string& job_id,
                                                  const std::string& path);
  absl::StatusOr<v1::CancelJobResponse> CancelJob(const std::string& job_id,
                                                  const std::string& reason);
  absl::StatusOr<v1::ShardMap> GetShardMap(const std::string& job_id);
  absl::StatusOr<v1::TaskLogsResponse> GetTaskLogs(const v1::TaskLogsRequest& req);
  // `include_history`: with each job's Job.history.
  absl::StatusOr<v1::ClusterStatusResponse> ClusterStatus(const std::string& job_id,
                                                          bool include_history = false);

  const ClientOptions& options() const { return options_; }

 private:
  SchedulerClient(const ClientOptions& options, std::shared_ptr<grpc::Channel> channel);
  // Converts a failed call into the status psctl prints.
  absl::Status Explain(const grpc::Status& status, const char* method) const;

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
};

}  // namespace pscluster::psctl

#endif  // PSCLUSTER_SCHEDULER_PSCTL_CLIENT_H_
