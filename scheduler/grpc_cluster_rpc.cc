#include "scheduler/grpc_cluster_rpc.h"

#include "absl/strings/str_cat.h"
#include "common/data_auth.h"
#include "common/scheduler_term.h"
#include "common/status_convert.h"

namespace pscluster::scheduler {

std::unique_ptr<grpc::ClientContext> GrpcClusterRpc::Context(absl::Duration timeout) const {
  auto ctx = CallContext(timeout, options_.channel);
  AddSchedulerTerm(ctx.get(), options_.scheduler_term);
  return ctx;
}

absl::StatusOr<GrpcClusterRpc::Stubs*> GrpcClusterRpc::Get(const std::string& address) {
  absl::MutexLock l(&mu_);
  auto it = stubs_.find(address);
  if (it != stubs_.end()) return it->second.get();
  auto channel = MakeChannel(address, options_.channel);
  if (!channel.ok()) return channel.status();
  auto stubs = std::make_unique<Stubs>();
  stubs->server = v1::ParameterServer::NewStub(*channel);
  stubs->worker = v1::WorkerControl::NewStub(*channel);
  Stubs* out = stubs.get();
  stubs_[address] = std::move(stubs);
  return out;
}

absl::Status GrpcClusterRpc::UpdateShardMap(const std::string& address,
                                            const v1::UpdateShardMapRequest& request) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  // A server answers once the copies to backups that the new map drops are delivered, which it
  // waits for up to its replication retry (10 s) plus 20 s: a shorter deadline would take a slow
  // copy for a failed switch and send the job into recovery while the server still takes the map.
  auto ctx = Context(std::max(options_.timeout, absl::Seconds(35)));
  v1::UpdateShardMapResponse resp;
  if (!options_.cluster_key.empty()) {
    v1::UpdateShardMapRequest with_secret = request;
    with_secret.set_data_secret(DeriveJobDataSecret(options_.cluster_key, request.map().job_id()));
    return FromGrpcStatus((*s)->server->UpdateShardMap(ctx.get(), with_secret, &resp),
                          absl::StrCat("UpdateShardMap to ", address));
  }
  return FromGrpcStatus((*s)->server->UpdateShardMap(ctx.get(), request, &resp),
                        absl::StrCat("UpdateShardMap to ", address));
}

absl::Status GrpcClusterRpc::DropJob(const std::string& address, const std::string& job_id) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  auto ctx = Context(options_.timeout);
  v1::DropJobRequest req;
  req.set_job_id(job_id);
  v1::DropJobResponse resp;
  return FromGrpcStatus((*s)->server->DropJob(ctx.get(), req, &resp),
                        absl::StrCat("DropJob to ", address));
}

absl::Status GrpcClusterRpc::CreateTables(const std::string& address,
                                          const v1::CreateTablesRequest& request) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  auto ctx = Context(options_.timeout);
  v1::CreateTablesResponse resp;
  return FromGrpcStatus((*s)->server->CreateTables(ctx.get(), request, &resp),
                        absl::StrCat("CreateTables to ", address));
}

absl::StatusOr<v1::ServerStatus> GrpcClusterRpc::ServerStatus(const std::string& address,
                                                              const std::string& job_id) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  auto ctx = Context(options_.timeout);
  v1::ServerStatusRequest req;
  req.set_job_id(job_id);
  v1::ServerStatus resp;
  absl::Status st = FromGrpcStatus((*s)->server->Status(ctx.get(), req, &resp),
                                   absl::StrCat("Status to ", address));
  if (!st.ok()) return st;
  return resp;
}

absl::StatusOr<v1::CheckpointResponse> GrpcClusterRpc::Checkpoint(const std::string& address,
                                                                  const std::string& job_id,
                                                                  const std::string& dir) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  // Writing a large model's shards takes longer than a control call.
  auto ctx = Context(std::max(options_.timeout, absl::Seconds(60)));
  v1::CheckpointRequest req;
  req.set_job_id(job_id);
  req.set_dir(dir);
  v1::CheckpointResponse resp;
  absl::Status st = FromGrpcStatus((*s)->server->Checkpoint(ctx.get(), req, &resp),
                                   absl::StrCat("Checkpoint to ", address));
  if (!st.ok()) return st;
  return resp;
}

absl::StatusOr<int64_t> GrpcClusterRpc::Fence(const std::string& address,
                                              const v1::FenceWorkerRequest& req,
                                              absl::string_view what) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  auto ctx = Context(options_.timeout);
  v1::FenceWorkerResponse resp;
  absl::Status st = FromGrpcStatus((*s)->server->FenceWorker(ctx.get(), req, &resp),
                                   absl::StrCat(what, " to ", address));
  if (!st.ok()) return st;
  return resp.clock();
}

absl::StatusOr<int64_t> GrpcClusterRpc::FenceWorker(const std::string& address,
                                                    const std::string& job_id, uint32_t worker,
                                                    uint32_t attempt) {
  v1::FenceWorkerRequest req;
  req.set_job_id(job_id);
  req.set_worker(worker);
  req.set_attempt(attempt);
  return Fence(address, req, "FenceWorker");
}

absl::StatusOr<int64_t> GrpcClusterRpc::LeaveJob(const std::string& address,
                                                 const std::string& job_id, uint32_t worker) {
  v1::FenceWorkerRequest req;
  req.set_job_id(job_id);
  req.set_worker(worker);
  req.set_leave(true);
  return Fence(address, req, "FenceWorker (leave)");
}

absl::StatusOr<int64_t> GrpcClusterRpc::RejoinJob(const std::string& address,
                                                  const std::string& job_id, uint32_t worker,
                                                  uint32_t attempt) {
  v1::FenceWorkerRequest req;
  req.set_job_id(job_id);
  req.set_worker(worker);
  req.set_attempt(attempt);
  req.set_rejoin(true);
  return Fence(address, req, "FenceWorker (rejoin)");
}

absl::Status GrpcClusterRpc::AssignTask(const std::string& address,
                                        const v1::AssignTaskRequest& request) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  auto ctx = Context(options_.timeout);
  v1::AssignTaskResponse resp;
  if (!options_.cluster_key.empty()) {
    v1::AssignTaskRequest with_secret = request;
    with_secret.set_data_secret(DeriveJobDataSecret(options_.cluster_key, request.job_id()));
    return FromGrpcStatus((*s)->worker->AssignTask(ctx.get(), with_secret, &resp),
                          absl::StrCat("AssignTask to ", address));
  }
  return FromGrpcStatus((*s)->worker->AssignTask(ctx.get(), request, &resp),
                        absl::StrCat("AssignTask to ", address));
}

absl::Status GrpcClusterRpc::StopTask(const std::string& address, const std::string& job_id,
                                      const std::string& reason) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  auto ctx = Context(options_.timeout);
  v1::StopTaskRequest req;
  req.set_job_id(job_id);
  req.set_reason(reason);
  v1::StopTaskResponse resp;
  return FromGrpcStatus((*s)->worker->StopTask(ctx.get(), req, &resp),
                        absl::StrCat("StopTask to ", address));
}

absl::Status GrpcClusterRpc::UpdateWorkerShardMap(const std::string& address,
                                                  const v1::ShardMap& map) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  auto ctx = Context(options_.timeout);
  v1::WorkerShardMapRequest req;
  *req.mutable_map() = map;
  v1::WorkerShardMapResponse resp;
  return FromGrpcStatus((*s)->worker->UpdateShardMap(ctx.get(), req, &resp),
                        absl::StrCat("UpdateShardMap to worker ", address));
}

absl::StatusOr<v1::WorkerStatus> GrpcClusterRpc::WorkerStatus(const std::string& address) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  auto ctx = Context(options_.timeout);
  v1::WorkerStatusRequest req;
  v1::WorkerStatus resp;
  absl::Status st = FromGrpcStatus((*s)->worker->Status(ctx.get(), req, &resp),
                                   absl::StrCat("Status to worker ", address));
  if (!st.ok()) return st;
  return resp;
}

absl::Status GrpcClusterRpc::UpdatePartition(const std::string& address,
                                             const v1::UpdatePartitionRequest& request) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  auto ctx = Context(options_.timeout);
  v1::UpdatePartitionResponse resp;
  return FromGrpcStatus((*s)->worker->UpdatePartition(ctx.get(), request, &resp),
                        absl::StrCat("UpdatePartition to worker ", address));
}

absl::StatusOr<v1::ExportModelResponse> GrpcClusterRpc::ExportModel(
    const std::string& address, const v1::ExportModelRequest& request, absl::Duration timeout) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  auto ctx = Context(timeout);
  v1::ExportModelResponse resp;
  absl::Status st = FromGrpcStatus((*s)->worker->ExportModel(ctx.get(), request, &resp),
                                   absl::StrCat("ExportModel to worker ", address));
  if (!st.ok()) return st;
  return resp;
}

absl::StatusOr<v1::TaskLogsResponse> GrpcClusterRpc::GetTaskLogs(
    const std::string& address, const v1::TaskLogsRequest& request) {
  auto s = Get(address);
  if (!s.ok()) return s.status();
  auto ctx = Context(options_.timeout);
  v1::TaskLogsResponse resp;
  absl::Status st = FromGrpcStatus((*s)->worker->GetTaskLogs(ctx.get(), request, &resp),
                                   absl::StrCat("GetTaskLogs to worker ", address));
  if (!st.ok()) return st;
  return resp;
}

}  // namespace pscluster::scheduler
