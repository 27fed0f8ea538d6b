#include "common/node_agent.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pscluster {

NodeAgent::NodeAgent(NodeAgentOptions options, NodeAgentCalls calls)
    : options_(std::move(options)), calls_(std::move(calls)),
      interval_(options_.heartbeat_interval) {}

NodeAgent::~NodeAgent() { Stop(); }

std::string NodeAgent::node_id() const {
  absl::MutexLock l(&mu_);
  return node_id_;
}

absl::Duration NodeAgent::heartbeat_interval() const {
  absl::MutexLock l(&mu_);
  return interval_;
}

absl::Status NodeAgent::RegisterOnce() {
  auto resp = calls_.register_node(node_id());
  if (!resp.ok()) return resp.status();
  absl::MutexLock l(&mu_);
  node_id_ = resp->node_id();
  if (resp->heartbeat_interval_ms() > 0) {
    interval_ = absl::Milliseconds(resp->heartbeat_interval_ms());
  } else if (resp->lease_ms() > 0) {
    interval_ = absl::Milliseconds(std::max<uint32_t>(resp->lease_ms() / 3, 100));
  }
  Logger(options_.component)
      ->info("registered with scheduler {} as node '{}' (lease {} ms, heartbeat every {})",
             options_.scheduler, node_id_, resp->lease_ms(), absl::FormatDuration(interval_));
  return absl::OkStatus();
}

absl::Status NodeAgent::Register() {
  const absl::Time give_up = absl::Now() + options_.register_timeout;
  absl::Duration backoff = options_.initial_backoff;
  while (true) {
    absl::Status st = RegisterOnce();
    if (st.ok()) return st;
    if (st.code() != absl::StatusCode::kUnavailable &&
        st.code() != absl::StatusCode::kDeadlineExceeded) {
      return st;
    }
    if (absl::Now() + backoff > give_up) {
      return absl::UnavailableError(absl::StrCat(
          "could not register with scheduler ", options_.scheduler, " within ",
          absl::FormatDuration(options_.register_timeout), ": ", st.message()));
    }
    Logger(options_.component)->warn("registering: {}; retrying in {}", st,
                                      absl::FormatDuration(backoff));
    if (stop_.WaitForNotificationWithTimeout(backoff)) {
      return absl::CancelledError("stopped while registering");
    }
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

void NodeAgent::StartHeartbeats() {
  thread_ = std::thread([this] { HeartbeatLoop(); });
}

void NodeAgent::StartAsync(std::function<void(absl::Status)> on_fatal) {
  thread_ = std::thread([this, on_fatal = std::move(on_fatal)] {
    absl::Status st = Register();
    if (!st.ok()) {
      if (st.code() != absl::StatusCode::kCancelled) {
        Logger(options_.component)->error("giving up registering: {}", st);
        if (on_fatal) on_fatal(st);
      }
      return;
    }
    HeartbeatLoop();
  });
}

void NodeAgent::HeartbeatLoop() {
  auto log = Logger(options_.component);
  bool failing = false;
  while (!stop_.WaitForNotificationWithTimeout(heartbeat_interval())) {
    absl::Status st = calls_.heartbeat(node_id());
    if (st.code() == absl::StatusCode::kNotFound) {
      log->warn("scheduler {} does not know node '{}'; registering again", options_.scheduler,
                node_id());
      st = RegisterOnce();
    }
    if (st.ok()) {
      if (failing) log->info("heartbeats to scheduler {} work again", options_.scheduler);
      failing = false;
    } else if (!failing) {
      log->warn("heartbeat to scheduler {}: {} (will keep trying)", options_.scheduler, st);
      failing = true;
    }
  }
}

void NodeAgent::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
  const std::string id = node_id();
  if (id.empty() || !calls_.deregister) return;
  absl::Status st = calls_.deregister(id);
  if (!st.ok()) Logger(options_.component)->warn("deregister: {}", st);
}

}  // namespace pscluster
