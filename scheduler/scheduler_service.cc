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
  // The job is recorded with its submitter's identity, which its quota is checked for.
  Serve<v1::SubmitJobRequest, v1::SubmitJobResponse>(
      "SubmitJob", [this](grpc::CallbackServerContext* ctx, const v1::SubmitJobRequest& req,
                          v1::SubmitJobResponse* resp, Done done) {
        std::string owner;
        if (authorizer() != nullptr) {
          // Already authorized by Serve(); this only names the caller.
          (void)authorizer()->Check(*ctx, "pscluster.v1.Scheduler.SubmitJob", &owner);
        }
        done(handler_->SubmitJob(req, resp, owner));
      });
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
