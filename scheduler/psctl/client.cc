#include "scheduler/psctl/client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_convert.h"

namespace pscluster::psctl {

absl::StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Connect(
    const ClientOptions& options) {
  auto channel = MakeChannel(options.address, options.channel);
  if (!channel.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--scheduler: ", channel.status().message()));
  }
  return std::unique_ptr<SchedulerClient>(new SchedulerClient(options, *channel));
}

SchedulerClient::SchedulerClient(const ClientOptions& options,
                                 std::shared_ptr<grpc::Channel> channel)
    : options_(options), channel_(std::move(channel)),
      stub_(v1::Scheduler::NewStub(channel_)) {}

namespace {

// A call that waits, up to its deadline, for the channel to connect: a scheduler that is
// starting, or a first connection attempt that failed, is not an error yet.
std::unique_ptr<grpc::ClientContext> Context(const ClientOptions& options) {
  auto ctx = CallContext(options.timeout, options.channel);
  ctx->set_wait_for_ready(true);
  return ctx;
}

}  // namespace

absl::Status SchedulerClient::Explain(const grpc::Status& status, const char* method) const {
  if (status.ok()) return absl::OkStatus();
  auto code = status.error_code();
  if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the scheduler at ", options_.address, " within ",
        absl::FormatDuration(options_.timeout), " (", method, ": ", status.error_message(),
        "). Is ps_scheduler running there? Set --scheduler=HOST:PORT or PSCLUSTER_SCHEDULER."));
  }
  if (code == grpc::StatusCode::UNAUTHENTICATED && options_.channel.bearer_token.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        status.error_message(), " (the scheduler checks callers: pass --token_file=FILE)"));
  }
  return FromGrpcStatus(status);
}

absl::StatusOr<v1::SubmitJobResponse> SchedulerClient::SubmitJob(const v1::SubmitJobRequest& req) {
  auto ctx = Context(options_);
  v1::SubmitJobResponse resp;
  absl::Status s = Explain(stub_->SubmitJob(ctx.get(), req, &resp), "SubmitJob");
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::Job> SchedulerClient::GetJob(const std::string& job_id) {
  auto ctx = Context(options_);
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::Job resp;
  absl::Status s = Explain(stub_->GetJob(ctx.get(), req, &resp), "GetJob");
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::ListJobsResponse> SchedulerClient::ListJobs(bool include_finished) {
  auto ctx = Context(options_);
  v1::ListJobsRequest req;
  req.set_include_finished(include_finished);
  v1::ListJobsResponse resp;
  absl::Status s = Explain(stub_->ListJobs(ctx.get(), req, &resp), "ListJobs");
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::CancelJobResponse> SchedulerClient::CancelJob(const std::string& job_id,
                                                                 const std::string& reason) {
  auto ctx = Context(options_);
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  req.set_reason(reason);
  v1::CancelJobResponse resp;
  absl::Status s = Explain(stub_->CancelJob(ctx.get(), req, &resp), "CancelJob");
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::MoveShardResponse> SchedulerClient::MoveShard(const std::string& job_id,
                                                                 uint32_t shard,
                                                                 const std::string& to,
                                                                 const std::string& from) {
  auto ctx = Context(options_);
  v1::MoveShardRequest req;
  req.set_job_id(job_id);
  req.set_shard(shard);
  req.set_to(to);
  req.set_from(from);
  v1::MoveShardResponse resp;
  absl::Status s = Explain(stub_->MoveShard(ctx.get(), req, &resp), "MoveShard");
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::ScaleJobResponse> SchedulerClient::ScaleJob(const std::string& job_id,
                                                               uint32_t servers) {
  auto ctx = Context(options_);
  v1::ScaleJobRequest req;
  req.set_job_id(job_id);
  req.set_servers(servers);
  v1::ScaleJobResponse resp;
  absl::Status s = Explain(stub_->ScaleJob(ctx.get(), req, &resp), "ScaleJob");
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::DrainServerResponse> SchedulerClient::DrainServer(const std::string& node_id) {
  auto ctx = Context(options_);
  v1::DrainServerRequest req;
  req.set_node_id(node_id);
  v1::DrainServerResponse resp;
  absl::Status s = Explain(stub_->DrainServer(ctx.get(), req, &resp), "DrainServer");
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::UndrainServerResponse> SchedulerClient::UndrainServer(
    const std::string& node_id) {
  auto ctx = Context(options_);
  v1::UndrainServerRequest req;
  req.set_node_id(node_id);
  v1::UndrainServerResponse resp;
  absl::Status s = Explain(stub_->UndrainServer(ctx.get(), req, &resp), "UndrainServer");
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::CheckpointJobResponse> SchedulerClient::CheckpointJob(
    const std::string& job_id, const std::string& dir) {
  auto ctx = Context(options_);
  v1::CheckpointJobRequest req;
  req.set_job_id(job_id);
  req.set_dir(dir);
  v1::CheckpointJobResponse resp;
  absl::Status s = Explain(stub_->CheckpointJob(ctx.get(), req, &resp), "CheckpointJob");
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::ExportJobResponse> SchedulerClient::ExportJob(const std::string& job_id,
                                                                 const std::string& path) {
  ClientOptions o = options_;
  o.timeout = std::max(o.timeout, absl::Seconds(130));
  auto ctx = Context(o);
  v1::ExportJobRequest req;
  req.set_job_id(job_id);
  req.set_path(path);
  v1::ExportJobResponse resp;
  absl::Status s = Explain(stub_->ExportJob(ctx.get(), req, &resp), "ExportJob");
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::TaskLogsResponse> SchedulerClient::GetTaskLogs(
    const v1::TaskLogsRequest& req) {
  auto ctx = Context(options_);
  v1::TaskLogsResponse resp;
  absl::Status s = Explain(stub_->GetTaskLogs(ctx.get(), req, &resp), "GetTaskLogs");
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::ShardMap> SchedulerClient::GetShardMap(const std::string& job_id) {
  auto ctx = Context(options_);
  v1::GetShardMapRequest req;
  req.set_job_id(job_id);
  v1::ShardMap resp;
  absl::Status s = Explain(stub_->GetShardMap(ctx.get(), req, &resp), "GetShardMap");
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::ClusterStatusResponse> SchedulerClient::ClusterStatus(
    const std::string& job_id, bool include_history) {
  auto ctx = Context(options_);
  v1::ClusterStatusRequest req;
  req.set_job_id(job_id);
  req.set_include_history(include_history);
  v1::ClusterStatusResponse resp;
  absl::Status s = Explain(stub_->ClusterStatus(ctx.get(), req, &resp), "ClusterStatus");
  if (!s.ok()) return s;
  return resp;
}

}  // namespace pscluster::psctl
