// ClusterRpc over gRPC: one channel per address (created on first use, reused), a deadline on
// every call.
//
// Thread-safe.
#ifndef PSCLUSTER_SCHEDULER_GRPC_CLUSTER_RPC_H_
#define PSCLUSTER_SCHEDULER_GRPC_CLUSTER_RPC_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "proto/ps.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "scheduler/cluster_rpc.h"

namespace pscluster::scheduler {

struct GrpcClusterRpcOptions {
  ChannelOptions channel;                    // TLS to the daemons.
  absl::Duration timeout = absl::Seconds(5);  // Deadline of each call.
  // The cluster key (Store::ClusterKey). When set, every shard map sent to a server and every
  // task sent to a worker carries the job's data secret derived from it (common/data_auth.h),
  // so that the job's data connections can prove it. The secret travels only on these calls.
  std::string cluster_key;
  // The leader's term (common/scheduler_term.h), sent with every call so that the daemons refuse
  // this scheduler's calls once a later leader has spoken to them; 0 = none (one scheduler).
  int64_t scheduler_term = 0;
};

class GrpcClusterRpc final : public ClusterRpc {
 public:
  explicit GrpcClusterRpc(const GrpcClusterRpcOptions& options) : options_(options) {}

  absl::Status UpdateShardMap(const std::string& address,
                              const v1::UpdateShardMapRequest& request) override;
  absl::Status DropJob(const std::string& address, const std::string& job_id) override;
  absl::Status CreateTables(const std::string& address,
                            const v1::CreateTablesRequest& request) override;
  absl::StatusOr<v1::ServerStatus> ServerStatus(const std::string& address,
                                                const std::string& job_id) override;
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string& address,
                                                    const std::string& job_id,
                                                    const std::string& dir) override;
  absl::StatusOr<int64_t> FenceWorker(const std::string& address, const std::string& job_id,
                                      uint32_t worker, uint32_t attempt) override;
  absl::Status AssignTask(const std::string& address,
                          const v1::AssignTaskRequest& request) override;
  absl::Status StopTask(const std::string& address, const std::string& job_id,
                        const std::string& reason) override;
  absl::Status UpdateWorkerShardMap(const std::string& address, const v1::ShardMap& map) override;
  absl::StatusOr<v1::WorkerStatus> WorkerStatus(const std::string& address) override;
  absl::StatusOr<int64_t> LeaveJob(const std::string& address, const std::string& job_id,
                                   uint32_t worker) override;
  absl::Status UpdatePartition(const std::string& address,
                               const v1::UpdatePartitionRequest& request) override;
  absl::StatusOr<v1::ExportModelResponse> ExportModel(const std::string& address,
                                                      const v1::ExportModelRequest& request,
                                                      absl::Duration timeout) override;
  absl::StatusOr<v1::TaskLogsResponse> GetTaskLogs(const std::string& address,
                                                   const v1::TaskLogsRequest& request) override;
  absl::StatusOr<int64_t> RejoinJob(const std::string& address, const std::string& job_id,
                                    uint32_t worker, uint32_t attempt) override;

 private:
  struct Stubs {
    std::unique_ptr<v1::ParameterServer::Stub> server;
    std::unique_ptr<v1::WorkerControl::Stub> worker;
  };
  absl::StatusOr<Stubs*> Get(const std::string& address);
  // A call's context: its deadline, and this leader's term.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const;
  // FenceWorker with `req`; returns the rank's clock. `what` names the call in errors.
  absl::StatusOr<int64_t> Fence(const std::string& address, const v1::FenceWorkerRequest& req,
                                absl::string_view what);

  const GrpcClusterRpcOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Stubs>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_GRPC_CLUSTER_RPC_H_
