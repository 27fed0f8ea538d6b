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
  absl::MutexLock l(&mu_);
  return node_id_;
}

absl::Status SchedulerLink::RegisterOnce() {
  v1::RegisterNodeRequest req;
  auto* n = req.mutable_node();
  n->set_node_id(node_id());
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
  {
    absl::MutexLock l(&mu_);
    node_id_ = resp.node_id();
    uint32_t ms = resp.heartbeat_interval_ms() ? resp.heartbeat_interval_ms()
                                               : std::max<uint32_t>(resp.lease_ms() / 3, 100);
    interval_ = absl::Milliseconds(ms);
  }
  handler_->set_node_id(resp.node_id());
  Logger("server")->info("registered with scheduler {} as node '{}' (lease {} ms)",
                         options_.scheduler, resp.node_id(), resp.lease_ms());
  return absl::OkStatus();
}

absl::Status SchedulerLink::Start() {
  auto ch = MakeChannel(options_.scheduler, options_.channel);
  if (!ch.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--scheduler: ", ch.status().message()));
  }
  stub_ = v1::Scheduler::NewStub(*ch);
  const absl::Time give_up = absl::Now() + options_.register_timeout;
  absl::Duration backoff = absl::Milliseconds(100);
  absl::Status st;
  while (true) {
    st = RegisterOnce();
    if (st.ok()) break;
    if (st.code() != absl::StatusCode::kUnavailable &&
        st.code() != absl::StatusCode::kDeadlineExceeded) {
      return st;
    }
    if (absl::Now() + backoff > give_up) {
      return absl::UnavailableError(absl::StrCat("could not register with --scheduler ",
                                                 options_.scheduler, " within ",
                                                 absl::FormatDuration(options_.register_timeout),
                                                 ": ", st.message()));
    }
    Logger("server")->warn("{}; retrying", st);
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
  thread_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

void SchedulerLink::HeartbeatLoop() {
  while (true) {
    absl::Duration interval;
    {
      absl::MutexLock l(&mu_);
      interval = interval_;
    }
    if (stop_.WaitForNotificationWithTimeout(interval)) return;
    v1::HeartbeatRequest req;
    req.set_node_id(node_id());
    std::vector<v1::ShardLoad> shards;
    handler_->Tick(req.mutable_load(), &shards);
    for (auto& s : shards) *req.add_shard_loads() = std::move(s);
    v1::HeartbeatResponse resp;
    auto ctx = CallContext(options_.call_timeout, options_.channel);
    absl::Status st = FromGrpcStatus(stub_->Heartbeat(ctx.get(), req, &resp),
                                     absl::StrCat("Heartbeat to scheduler ", options_.scheduler));
    if (st.code() == absl::StatusCode::kNotFound) {
      Logger("server")->warn("scheduler forgot node '{}'; registering again", node_id());
      st = RegisterOnce();
    }
    if (!st.ok()) Logger("server")->warn("{}", st);
  }
}

void SchedulerLink::Stop() {
  if (!thread_.joinable()) return;
  stop_.Notify();
  thread_.join();
  v1::DeregisterRequest req;
  req.set_node_id(node_id());
  v1::DeregisterResponse resp;
  auto ctx = CallContext(options_.call_timeout, options_.channel);
  absl::Status st = FromGrpcStatus(stub_->Deregister(ctx.get(), req, &resp), "Deregister");
  if (!st.ok()) Logger("server")->warn("{}", st);
}

}  // namespace pscluster
