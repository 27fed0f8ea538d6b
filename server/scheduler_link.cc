#include "server/scheduler_link.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_convert.h"

namespace pscluster {

SchedulerLink::SchedulerLink(SchedulerLinkOptions options, PsHandler* handler)
    : options_(std::move(options)), handler_(handler) {}

SchedulerLink::~SchedulerLink() { Stop(); }

std::string SchedulerLink::node_id() const {
  return agent_ != nullptr ? agent_->node_id() : std::string();
}

absl::StatusOr<v1::RegisterNodeResponse> SchedulerLink::RegisterNode(const std::string& node_id) {
  v1::RegisterNodeRequest req;
  auto* n = req.mutable_node();
  n->set_node_id(node_id);
  n->set_role(v1::ROLE_SERVER);
  n->set_address(options_.advertise_address);
  n->mutable_capacity()->set_memory_bytes(options_.memory_bytes);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  n->set_hostname(host);
  n->set_pid(getpid());
  n->set_version(options_.version);
  v1::RegisterNodeResponse resp;
  auto ctx = CallContext(options_.call_timeout, options_.channel);
  absl::Status st = FromGrpcStatus(stub_->RegisterNode(ctx.get(), req, &resp),
                                   absl::StrCat("RegisterNode to scheduler ", options_.scheduler));
  if (!st.ok()) return st;
  handler_->set_node_id(resp.node_id());
  return resp;
}

absl::Status SchedulerLink::Heartbeat(const std::string& node_id) {
  v1::HeartbeatRequest req;
  req.set_node_id(node_id);
  std::vector<v1::ShardLoad> shards;
  handler_->Tick(req.mutable_load(), &shards);
  for (auto& s : shards) *req.add_shard_loads() = std::move(s);
  v1::HeartbeatResponse resp;
  auto ctx = CallContext(options_.call_timeout, options_.channel);
  return FromGrpcStatus(stub_->Heartbeat(ctx.get(), req, &resp),
                        absl::StrCat("Heartbeat to scheduler ", options_.scheduler));
}

absl::Status SchedulerLink::Deregister(const std::string& node_id) {
  v1::DeregisterRequest req;
  req.set_node_id(node_id);
  v1::DeregisterResponse resp;
  auto ctx = CallContext(options_.call_timeout, options_.channel);
  return FromGrpcStatus(stub_->Deregister(ctx.get(), req, &resp), "Deregister");
}

absl::Status SchedulerLink::Start() {
  auto ch = MakeChannel(options_.scheduler, options_.channel);
  if (!ch.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--scheduler: ", ch.status().message()));
  }
  stub_ = v1::Scheduler::NewStub(*ch);
  NodeAgentOptions ao;
  ao.component = "server";
  ao.scheduler = options_.scheduler;
  ao.register_timeout = options_.register_timeout;
  NodeAgentCalls calls;
  calls.register_node = [this](const std::string& id) { return RegisterNode(id); };
  calls.heartbeat = [this](const std::string& id) { return Heartbeat(id); };
  calls.deregister = [this](const std::string& id) { return Deregister(id); };
  agent_ = std::make_unique<NodeAgent>(ao, std::move(calls));
  absl::Status st = agent_->Register();
  if (!st.ok()) {
    agent_.reset();
    // Name the flag: the operator fixes --scheduler or starts the scheduler.
    return absl::Status(st.code(), absl::StrCat("--scheduler ", options_.scheduler, ": ",
                                                st.message()));
  }
  agent_->StartHeartbeats();
  return absl::OkStatus();
}

void SchedulerLink::Stop() {
  if (agent_ != nullptr) agent_->Stop();
}

}  // namespace pscluster
