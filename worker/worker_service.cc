#include "worker/worker_service.h"

namespace pscluster::worker {

WorkerService::WorkerService(WorkerNode* node, const Authorizer* authz)
    : ParsedUnaryService("pscluster.v1.WorkerControl"), node_(node) {
  SetAuthorizer(authz);
  Serve<v1::AssignTaskRequest, v1::AssignTaskResponse>(
      "AssignTask", [this](grpc::CallbackServerContext*, const v1::AssignTaskRequest& req,
                           v1::AssignTaskResponse*, Done done) { done(node_->AssignTask(req)); });
  Serve<v1::StopTaskRequest, v1::StopTaskResponse>(
      "StopTask", [this](grpc::CallbackServerContext*, const v1::StopTaskRequest& req,
                         v1::StopTaskResponse*, Done done) { done(node_->StopTask(req)); });
  Serve<v1::WorkerShardMapRequest, v1::WorkerShardMapResponse>(
      "UpdateShardMap", [this](grpc::CallbackServerContext*, const v1::WorkerShardMapRequest& req,
                               v1::WorkerShardMapResponse* resp, Done done) {
        auto epoch = node_->UpdateShardMap(req);
        if (epoch.ok()) resp->set_epoch(*epoch);
        done(epoch.status());
      });
  Serve<v1::UpdatePartitionRequest, v1::UpdatePartitionResponse>(
      "UpdatePartition",
      [this](grpc::CallbackServerContext*, const v1::UpdatePartitionRequest& req,
             v1::UpdatePartitionResponse*, Done done) { done(node_->UpdatePartition(req)); });
  Serve<v1::WorkerStatusRequest, v1::WorkerStatus>(
      "Status", [this](grpc::CallbackServerContext*, const v1::WorkerStatusRequest&,
                       v1::WorkerStatus* resp, Done done) {
        *resp = node_->Status();
        done(absl::OkStatus());
      });
  CheckEveryUnaryMethodServed();
}

}  // namespace pscluster::worker
