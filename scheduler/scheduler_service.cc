#include "scheduler/scheduler_service.h"

namespace pscluster::scheduler {

template <typename Req, typename Resp>
void SchedulerService::Inline(absl::string_view method,
                              absl::Status (Scheduler::*fn)(const Req&, Resp*)) {
  Serve<Req, Resp>(method, [this, fn](grpc::CallbackServerContext*, const Req& req, Resp* resp,
                                      Done done) { done((handler_->*fn)(req, resp)); });
}

SchedulerService::SchedulerService(Scheduler* handler, const Authorizer* authz)
    : ParsedUnaryService("pscluster.v1.Scheduler"), handler_(handler) {
  SetAuthorizer(authz);
  Inline("RegisterNode", &Scheduler::RegisterNode);
  Inline("Heartbeat", &Scheduler::Heartbeat);
  Serve<v1::DeregisterRequest, v1::DeregisterResponse>(
      "Deregister", [this](grpc::CallbackServerContext*, const v1::DeregisterRequest& req,
                           v1::DeregisterResponse*, Done done) { done(handler_->Deregister(req)); });
  Inline("SubmitJob", &Scheduler::SubmitJob);
  Inline("GetJob", &Scheduler::GetJob);
  Inline("ListJobs", &Scheduler::ListJobs);
  Inline("CancelJob", &Scheduler::CancelJob);
  Inline("GetShardMap", &Scheduler::GetShardMap);
  Inline("ReportProgress", &Scheduler::ReportProgress);
  Inline("ClusterStatus", &Scheduler::ClusterStatus);
  Inline("MoveShard", &Scheduler::MoveShard);
  Inline("CheckpointJob", &Scheduler::CheckpointJob);
  Inline("ExportJob", &Scheduler::ExportJob);
  Inline("GetTaskLogs", &Scheduler::GetTaskLogs);
  Inline("ScaleJob", &Scheduler::ScaleJob);
  Inline("DrainServer", &Scheduler::DrainServer);
  Inline("UndrainServer", &Scheduler::UndrainServer);
  CheckEveryUnaryMethodServed();
}

}  // namespace pscluster::scheduler
