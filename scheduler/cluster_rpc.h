// The calls the scheduler makes to servers and workers. An interface so that the scheduler's
// logic does not depend on how the calls travel; GrpcClusterRpc is the one the daemon uses.
#ifndef PSCLUSTER_SCHEDULER_CLUSTER_RPC_H_
#define PSCLUSTER_SCHEDULER_CLUSTER_RPC_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/ps.pb.h"
#include "proto/worker.pb.h"

namespace pscluster::scheduler {

// Every method blocks until the call ends or its deadline passes; errors name the address.
class ClusterRpc {
 public:
  virtual ~ClusterRpc() = default;

  // ParameterServer on a server.
  virtual absl::Status UpdateShardMap(const std::string& address,
                                      const v1::UpdateShardMapRequest& request) = 0;
  virtual absl::Status DropJob(const std::string& address, const std::string& job_id) = 0;
  // Declares a job's tables on a server (one joining the job in the middle of its run).
  virtual absl::Status CreateTables(const std::string& address,
                                    const v1::CreateTablesRequest& request) = 0;
  virtual absl::StatusOr<v1::ServerStatus> ServerStatus(const std::string& address,
                                                        const std::string& job_id) = 0;
  // A checkpoint of the job's shards on the server, written under `dir`.
  virtual absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string& address,
                                                            const std::string& job_id,
                                                            const std::string& dir) = 0;
  // Fences `worker` of the job at `attempt` on the server; returns the rank's clock there.
  virtual absl::StatusOr<int64_t> FenceWorker(const std::string& address,
                                              const std::string& job_id, uint32_t worker,
                                              uint32_t attempt) = 0;

  // Takes `worker` out of the job for good on the server (FenceWorkerRequest.leave); returns
  // the rank's final clock there.
  virtual absl::StatusOr<int64_t> LeaveJob(const std::string& address, const std::string& job_id,
                                           uint32_t worker) = 0;

  // Lets `worker`, which left the job, take part again with `attempt` (FenceWorkerRequest
  // .rejoin); returns its new clock there (the slowest of the ranks training).
  virtual absl::StatusOr<int64_t> RejoinJob(const std::string& address,
                                            const std::string& job_id, uint32_t worker,
                                            uint32_t attempt) = 0;

  // WorkerControl on a worker.
  virtual absl::Status AssignTask(const std::string& address,
                                  const v1::AssignTaskRequest& request) = 0;
  virtual absl::Status StopTask(const std::string& address, const std::string& job_id,
                                const std::string& reason) = 0;
  virtual absl::Status UpdateWorkerShardMap(const std::string& address,
                                            const v1::ShardMap& map) = 0;
  virtual absl::StatusOr<v1::WorkerStatus> WorkerStatus(const std::string& address) = 0;
  virtual absl::Status UpdatePartition(const std::string& address,
                                       const v1::UpdatePartitionRequest& request) = 0;
  // The lead rank's task writes the model now (psctl export); may take up to `timeout` (the
  // pull waits for every rank to reach the step).
  virtual absl::StatusOr<v1::ExportModelResponse> ExportModel(
      const std::string& address, const v1::ExportModelRequest& request,
      absl::Duration timeout) = 0;
  // An entrypoint task's output lines (psctl logs).
  virtual absl::StatusOr<v1::TaskLogsResponse> GetTaskLogs(const std::string& address,
                                                           const v1::TaskLogsRequest& request) = 0;
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_CLUSTER_RPC_H_
