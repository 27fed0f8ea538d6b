// gRPC adapter of WorkerControl: unpacks requests, calls WorkerNode, converts the status. No
// logic lives here.
#ifndef PSCLUSTER_WORKER_WORKER_SERVICE_H_
#define PSCLUSTER_WORKER_WORKER_SERVICE_H_

#include "proto/worker.grpc.pb.h"
#include "worker/worker_node.h"

namespace pscluster::worker {

class WorkerService final : public v1::WorkerControl::CallbackService {
 public:
  // REQUIRES: `node` outlives the service.
  explicit WorkerService(WorkerNode* node) : node_(node) {}

  grpc::ServerUnaryReactor* AssignTask(grpc::CallbackServerContext* ctx,
                                       const v1::AssignTaskRequest* request,
                                       v1::AssignTaskResponse* response) override;
  grpc::ServerUnaryReactor* StopTask(grpc::CallbackServerContext* ctx,
                                     const v1::StopTaskRequest* request,
                                     v1::StopTaskResponse* response) override;
  grpc::ServerUnaryReactor* UpdateShardMap(grpc::CallbackServerContext* ctx,
                                           const v1::WorkerShardMapRequest* request,
                                           v1::WorkerShardMapResponse* response) override;
  grpc::ServerUnaryReactor* UpdatePartition(grpc::CallbackServerContext* ctx,
                                            const v1::UpdatePartitionRequest* request,
                                            v1::UpdatePartitionResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const v1::WorkerStatusRequest* request,
                                   v1::WorkerStatus* response) override;

 private:
  WorkerNode* const node_;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_WORKER_SERVICE_H_
