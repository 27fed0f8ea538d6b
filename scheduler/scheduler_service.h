// The Scheduler gRPC service: a thin callback-API adapter over the Scheduler handler. Each
// method converts the handler's absl::Status at the edge and finishes the call inline (the
// handlers only touch memory and short SQLite transactions; they never wait on another daemon).
#ifndef PSCLUSTER_SCHEDULER_SCHEDULER_SERVICE_H_
#define PSCLUSTER_SCHEDULER_SCHEDULER_SERVICE_H_

#include "proto/scheduler.grpc.pb.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {

class SchedulerService final : public v1::Scheduler::CallbackService {
 public:
  // REQUIRES: `handler` outlives the service.
  explicit SchedulerService(Scheduler* handler) : handler_(handler) {}

  grpc::ServerUnaryReactor* RegisterNode(grpc::CallbackServerContext* ctx,
                                         const v1::RegisterNodeRequest* req,
                                         v1::RegisterNodeResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* Deregister(grpc::CallbackServerContext* ctx,
                                       const v1::DeregisterRequest* req,
                                       v1::DeregisterResponse* resp) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx,
                                      const v1::SubmitJobRequest* req,
                                      v1::SubmitJobResponse* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req,
                                      v1::CancelJobResponse* resp) override;
  grpc::ServerUnaryReactor* GetShardMap(grpc::CallbackServerContext* ctx,
                                        const v1::GetShardMapRequest* req,
                                        v1::ShardMap* resp) override;
  grpc::ServerUnaryReactor* ReportProgress(grpc::CallbackServerContext* ctx,
                                           const v1::ReportProgressRequest* req,
                                           v1::ReportProgressResponse* resp) override;
  grpc::ServerUnaryReactor* ClusterStatus(grpc::CallbackServerContext* ctx,
                                          const v1::ClusterStatusRequest* req,
                                          v1::ClusterStatusResponse* resp) override;
  grpc::ServerUnaryReactor* MoveShard(grpc::CallbackServerContext* ctx,
                                      const v1::MoveShardRequest* req,
                                      v1::MoveShardResponse* resp) override;

 private:
  Scheduler* const handler_;
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_SCHEDULER_SERVICE_H_
