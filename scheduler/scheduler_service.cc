#include "scheduler/scheduler_service.h"

#include "common/status_convert.h"

namespace pscluster::scheduler {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* SchedulerService::RegisterNode(grpc::CallbackServerContext* ctx,
                                                         const v1::RegisterNodeRequest* req,
                                                         v1::RegisterNodeResponse* resp) {
  return Done(ctx, handler_->RegisterNode(*req, resp));
}

grpc::ServerUnaryReactor* SchedulerService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                      const v1::HeartbeatRequest* req,
                                                      v1::HeartbeatResponse* resp) {
  return Done(ctx, handler_->Heartbeat(*req, resp));
}

grpc::ServerUnaryReactor* SchedulerService::Deregister(grpc::CallbackServerContext* ctx,
                                                       const v1::DeregisterRequest* req,
                                                       v1::DeregisterResponse*) {
  return Done(ctx, handler_->Deregister(*req));
}

grpc::ServerUnaryReactor* SchedulerService::SubmitJob(grpc::CallbackServerContext* ctx,
                                                      const v1::SubmitJobRequest* req,
                                                      v1::SubmitJobResponse* resp) {
  return Done(ctx, handler_->SubmitJob(*req, resp));
}

grpc::ServerUnaryReactor* SchedulerService::GetJob(grpc::CallbackServerContext* ctx,
                                                   const v1::GetJobRequest* req, v1::Job* resp) {
  return Done(ctx, handler_->GetJob(*req, resp));
}

grpc::ServerUnaryReactor* SchedulerService::ListJobs(grpc::CallbackServerContext* ctx,
                                                     const v1::ListJobsRequest* req,
                                                     v1::ListJobsResponse* resp) {
  return Done(ctx, handler_->ListJobs(*req, resp));
}

grpc::ServerUnaryReactor* SchedulerService::CancelJob(grpc::CallbackServerContext* ctx,
                                                      const v1::CancelJobRequest* req,
                                                      v1::CancelJobResponse* resp) {
  return Done(ctx, handler_->CancelJob(*req, resp));
}

grpc::ServerUnaryReactor* SchedulerService::GetShardMap(grpc::CallbackServerContext* ctx,
                                                        const v1::GetShardMapRequest* req,
                                                        v1::ShardMap* resp) {
  return Done(ctx, handler_->GetShardMap(*req, resp));
}

grpc::ServerUnaryReactor* SchedulerService::ReportProgress(grpc::CallbackServerContext* ctx,
                                                           const v1::ReportProgressRequest* req,
                                                           v1::ReportProgressResponse* resp) {
  return Done(ctx, handler_->ReportProgress(*req, resp));
}

grpc::ServerUnaryReactor* SchedulerService::MoveShard(grpc::CallbackServerContext* ctx,
                                                      const v1::MoveShardRequest* req,
                                                      v1::MoveShardResponse* resp) {
  return Done(ctx, handler_->MoveShard(*req, resp));
}

grpc::ServerUnaryReactor* SchedulerService::ClusterStatus(grpc::CallbackServerContext* ctx,
                                                          const v1::ClusterStatusRequest* req,
                                                          v1::ClusterStatusResponse* resp) {
  return Done(ctx, handler_->ClusterStatus(*req, resp));
}

}  // namespace pscluster::scheduler
