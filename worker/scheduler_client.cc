#include "worker/scheduler_client.h"

#include "absl/strings/str_cat.h"
#include "common/status_convert.h"

namespace pscluster::worker {

absl::StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Create(
    const std::string& address, const ChannelOptions& options, absl::Duration timeout) {
  auto channel = MakeChannel(address, options);
  if (!channel.ok()) {
    return absl::Status(channel.status().code(),
                        absl::StrCat("--scheduler: ", channel.status().message()));
  }
  return std::unique_ptr<SchedulerClient>(
      new SchedulerClient(address, options, timeout, v1::Scheduler::NewStub(*channel)));
}

absl::StatusOr<v1::RegisterNodeResponse> SchedulerClient::Register(const v1::NodeInfo& node) {
  v1::RegisterNodeRequest req;
  *req.mutable_node() = node;
  v1::RegisterNodeResponse resp;
  auto ctx = CallContext(timeout_, options_);
  absl::Status s = FromGrpcStatus(stub_->RegisterNode(ctx.get(), req, &resp),
                                  absl::StrCat("RegisterNode at scheduler ", address_));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> SchedulerClient::Heartbeat(const v1::HeartbeatRequest& req) {
  v1::HeartbeatResponse resp;
  auto ctx = CallContext(timeout_, options_);
  absl::Status s = FromGrpcStatus(stub_->Heartbeat(ctx.get(), req, &resp),
                                  absl::StrCat("Heartbeat to scheduler ", address_));
  if (!s.ok()) return s;
  return resp;
}

absl::Status SchedulerClient::Deregister(const std::string& node_id) {
  v1::DeregisterRequest req;
  req.set_node_id(node_id);
  v1::DeregisterResponse resp;
  auto ctx = CallContext(timeout_, options_);
  return FromGrpcStatus(stub_->Deregister(ctx.get(), req, &resp),
                        absl::StrCat("Deregister at scheduler ", address_));
}

absl::StatusOr<bool> SchedulerClient::ReportProgress(const std::string& job_id,
                                                     const v1::WorkerProgress& progress) {
  v1::ReportProgressRequest req;
  req.set_job_id(job_id);
  *req.mutable_progress() = progress;
  v1::ReportProgressResponse resp;
  auto ctx = CallContext(timeout_, options_);
  absl::Status s = FromGrpcStatus(stub_->ReportProgress(ctx.get(), req, &resp),
                                  absl::StrCat("ReportProgress to scheduler ", address_));
  if (!s.ok()) return s;
  return resp.cancel();
}

absl::StatusOr<v1::ShardMap> SchedulerClient::GetShardMap(const std::string& job_id) {
  v1::GetShardMapRequest req;
  req.set_job_id(job_id);
  v1::ShardMap map;
  auto ctx = CallContext(timeout_, options_);
  absl::Status s = FromGrpcStatus(stub_->GetShardMap(ctx.get(), req, &map),
                                  absl::StrCat("GetShardMap from scheduler ", address_));
  if (!s.ok()) return s;
  return map;
}

}  // namespace pscluster::worker
