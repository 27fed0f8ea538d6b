#include "worker/worker_service.h"

namespace pscluster::worker {

WorkerService::WorkerService(WorkerNode* node, const Authorizer* authz, const TaskLogBook* logs)
    : ParsedUnaryService("pscluster.v1.WorkerControl"), node_(node), logs_(logs) {
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
  Serve<v1::ExportModelRequest, v1::ExportModelResponse>(
      "ExportModel", [this](grpc::CallbackServerContext*, const v1::ExportModelRequest& req,
                            v1::ExportModelResponse* resp, Done done) {
        auto fn = node_->PrepareExport(req);
        if (!fn.ok()) return done(fn.status());
        exports_.Post([fn = std::move(*fn), resp, done] {
          auto written = fn();
          if (written.ok()) *resp = *written;
          done(written.status());
        });
      });
  Serve<v1::TaskLogsRequest, v1::TaskLogsResponse>(
      "GetTaskLogs", [this](grpc::CallbackServerContext*, const v1::TaskLogsRequest& req,
                            v1::TaskLogsResponse* resp, Done done) {
        if (logs_ == nullptr) return done(absl::NotFoundError("this worker keeps no task output"));
        auto got = logs_->Read(req);
        if (got.ok()) *resp = std::move(*got);
        done(got.status());
      });
  CheckEveryUnaryMethodServed();
}

}  // namespace pscluster::worker
