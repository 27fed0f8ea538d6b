#include "worker/worker_service.h"

#include "common/status_convert.h"

namespace pscluster::worker {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* WorkerService::AssignTask(grpc::CallbackServerContext* ctx,
                                                    const v1::AssignTaskRequest* request,
                                                    v1::AssignTaskResponse*) {
  return Done(ctx, node_->AssignTask(*request));
}

grpc::ServerUnaryReactor* WorkerService::StopTask(grpc::CallbackServerContext* ctx,
                                                  const v1::StopTaskRequest* request,
                                                  v1::StopTaskResponse*) {
  return Done(ctx, node_->StopTask(*request));
}

grpc::ServerUnaryReactor* WorkerService::UpdateShardMap(grpc::CallbackServerContext* ctx,
                                                        const v1::WorkerShardMapRequest* request,
                                                        v1::WorkerShardMapResponse* response) {
  auto epoch = node_->UpdateShardMap(*request);
  if (epoch.ok()) response->set_epoch(*epoch);
  return Done(ctx, epoch.status());
}

grpc::ServerUnaryReactor* WorkerService::UpdatePartition(
    grpc::CallbackServerContext* ctx, const v1::UpdatePartitionRequest* request,
    v1::UpdatePartitionResponse*) {
  return Done(ctx, node_->UpdatePartition(*request));
}

grpc::ServerUnaryReactor* WorkerService::Status(grpc::CallbackServerContext* ctx,
                                                const v1::WorkerStatusRequest*,
                                                v1::WorkerStatus* response) {
  *response = node_->Status();
  return Done(ctx, absl::OkStatus());
}

}  // namespace pscluster::worker
