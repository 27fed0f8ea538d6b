#include "worker/worker_node.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace pscluster::worker {
namespace {

// How long a new task waits for an ended task's final report to go out (see AssignTask).
constexpr absl::Duration kEndedTaskWait = absl::Seconds(5);

std::string Hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

WorkerNode::WorkerNode(WorkerNodeOptions options, SchedulerClient* scheduler,
                       TaskRunnerFactory factory)
    : options_(std::move(options)),
      scheduler_(scheduler),
      factory_(std::move(factory)),
      address_(options_.address) {
  if (scheduler_ == nullptr) return;
  NodeAgentOptions ao;
  ao.component = "worker";
  ao.scheduler = scheduler_->address();
  ao.register_timeout = options_.registration_timeout;
  ao.heartbeat_interval = options_.heartbeat_interval;
  NodeAgentCalls calls;
  calls.register_node = [this](const std::string& id) { return RegisterNode(id); };
  calls.heartbeat = [this](const std::string& id) { return Heartbeat(id); };
  calls.deregister = [this](const std::string& id) { return scheduler_->Deregister(id); };
  agent_ = std::make_unique<NodeAgent>(ao, std::move(calls));
}

void WorkerNode::SetAddress(const std::string& address) {
  absl::MutexLock l(&mu_);
  address_ = address;
}

WorkerNode::~WorkerNode() { Shutdown(); }

void WorkerNode::Start(std::function<void(absl::Status)> on_fatal) {
  if (agent_ != nullptr) agent_->StartAsync(std::move(on_fatal));
}

void WorkerNode::Shutdown() {
  std::thread task;
  {
    absl::MutexLock l(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    if (runner_ != nullptr && busy_) runner_->Cancel("worker shutting down");
    task = std::move(task_thread_);
  }
  if (task.joinable()) task.join();
  if (agent_ != nullptr) agent_->Stop();  // Heartbeats end; the node deregisters.
}

std::string WorkerNode::node_id() const {
  return agent_ != nullptr ? agent_->node_id() : std::string();
}

absl::StatusOr<v1::RegisterNodeResponse> WorkerNode::RegisterNode(const std::string& node_id) {
  v1::NodeInfo info;
  info.set_node_id(node_id);
  info.set_role(v1::ROLE_WORKER);
  {
    absl::MutexLock l(&mu_);
    info.set_address(address_);
  }
  *info.mutable_capacity() = options_.capacity;
  info.set_hostname(Hostname());
  info.set_pid(::getpid());
  info.set_version("pscluster-1");
  info.set_allow_entrypoints(options_.allow_entrypoints);
  return scheduler_->Register(info);
}

absl::Status WorkerNode::Heartbeat(const std::string& node_id) {
  v1::HeartbeatRequest hb;
  hb.set_node_id(node_id);
  {
    absl::MutexLock l(&mu_);
    if (busy_ && runner_ != nullptr) {
      TaskSnapshot snap = runner_->Snapshot();
      auto* t = hb.add_tasks();
      t->set_job_id(job_id_);
      t->set_rank(rank_);
      t->set_samples_per_sec(snap.samples_per_sec);
    }
  }
  auto resp = scheduler_->Heartbeat(hb);
  return resp.ok() ? absl::OkStatus() : resp.status();
}

absl::Status WorkerNode::AssignTask(const v1::AssignTaskRequest& request) {
  if (request.job_id().empty()) return absl::InvalidArgumentError("job_id: must not be empty");
  if (request.num_workers() == 0) {
    return absl::InvalidArgumentError("num_workers: must be at least 1");
  }
  if (request.rank() >= request.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", request.rank(),
                                                   " is not below num_workers ",
                                                   request.num_workers()));
  }
  if (!request.has_spec()) return absl::InvalidArgumentError("spec: missing");
  if (request.shard_map().assignments_size() == 0) {
    return absl::InvalidArgumentError("shard_map: has no assignments");
  }
  absl::MutexLock l(&mu_);
  if (shutting_down_) return absl::UnavailableError("worker is shutting down");
  if (busy_ && task_ended_) {
    // The task has ended and its final report is on its way: the scheduler may act on the report
    // (hand the rank back to this worker) before the report's call returns here. Wait for it
    // rather than refuse the new task as "busy" (mu_ is released meanwhile).
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](bool* busy) { return !*busy; }, &busy_),
                         kEndedTaskWait);
  }
  JoinFinishedTaskLocked();
  if (busy_) {
    if (job_id_ == request.job_id() && rank_ == request.rank() &&
        attempt_ == request.attempt()) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat("worker is busy with job ", job_id_,
                                                      " (rank ", rank_, ", attempt ", attempt_,
                                                      ")"));
  }
  auto runner = factory_(request, this);
  if (!runner.ok()) return runner.status();
  runner_ = std::move(*runner);
  busy_ = true;
  task_ended_ = false;
  job_id_ = request.job_id();
  rank_ = request.rank();
  attempt_ = request.attempt();
  last_error_.clear();
  pending_progress_.Clear();
  last_report_ = absl::InfinitePast();
  Logger("worker")->info("task: job {} rank {}/{}", job_id_, rank_, request.num_workers());
  task_thread_ =
      std::thread(&WorkerNode::RunTask, this, runner_.get(), job_id_, rank_, attempt_);
  return absl::OkStatus();
}

void WorkerNode::JoinFinishedTaskLocked() {
  if (!busy_ && task_thread_.joinable()) {
    // The thread has left RunTask's critical section; joining is quick.
    task_thread_.join();
    runner_.reset();
  }
}

void WorkerNode::RunTask(TaskRunner* runner, std::string job_id, uint32_t rank,
                         uint32_t attempt) {
  absl::Status s = runner->Run();
  auto log = Logger("worker");
  v1::WorkerProgress final;
  {
    absl::MutexLock l(&mu_);
    final = pending_progress_;
    task_ended_ = true;
  }
  final.set_rank(rank);
  final.set_attempt(attempt);
  final.set_node_id(node_id());
  if (s.ok()) {
    final.set_done(true);
    log->info("task done: job {} rank {}", job_id, rank);
  } else if (s.code() == absl::StatusCode::kCancelled) {
    log->info("task stopped: job {} rank {}: {}", job_id, rank, s.message());
  } else {
    std::string address;
    {
      absl::MutexLock l(&mu_);
      address = address_;
    }
    final.set_error(absl::StrCat("worker ", address, " rank ", rank, ": ", s.ToString()));
    // A server out of reach (the data plane's calls retry until their deadline): another worker
    // may well reach it.
    final.set_retryable(s.code() == absl::StatusCode::kUnavailable ||
                        s.code() == absl::StatusCode::kDeadlineExceeded);
    log->error("task failed: job {} rank {}: {}", job_id, rank, s);
  }
  if (s.code() != absl::StatusCode::kCancelled && scheduler_ != nullptr) {
    // The final report decides the job's fate: retry it for two minutes (the scheduler may be
    // restarting).
    for (int tries = 0; tries < 240; ++tries) {
      {
        absl::MutexLock l(&mu_);
        if (shutting_down_) break;
      }
      auto r = scheduler_->ReportProgress(job_id, final);
      if (r.ok()) break;
      log->warn("final progress report: {} (retrying)", r.status());
      absl::SleepFor(absl::Milliseconds(500));
    }
  }
  absl::MutexLock l(&mu_);
  if (!s.ok() && s.code() != absl::StatusCode::kCancelled) last_error_ = s.ToString();
  busy_ = false;
}

absl::Status WorkerNode::StopTask(const v1::StopTaskRequest& request) {
  absl::MutexLock l(&mu_);
  if (!busy_ || runner_ == nullptr) return absl::OkStatus();
  if (!request.job_id().empty() && request.job_id() != job_id_) {
    return absl::NotFoundError(absl::StrCat("job_id: ", request.job_id(),
                                            " is not running here (running: ", job_id_, ")"));
  }
  runner_->Cancel(request.reason().empty() ? "stopped by the scheduler" : request.reason());
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> WorkerNode::UpdateShardMap(const v1::WorkerShardMapRequest& request) {
  absl::MutexLock l(&mu_);
  if (!busy_ || runner_ == nullptr) {
    return absl::FailedPreconditionError("no task is running on this worker");
  }
  if (request.map().job_id() != job_id_) {
    return absl::NotFoundError(absl::StrCat("map.job_id: ", request.map().job_id(),
                                            " is not running here"));
  }
  runner_->UpdateShardMap(request.map());
  return runner_->Snapshot().shard_map_epoch;
}

absl::Status WorkerNode::UpdatePartition(const v1::UpdatePartitionRequest& request) {
  absl::MutexLock l(&mu_);
  if (!busy_ || runner_ == nullptr || job_id_ != request.job_id() || rank_ != request.rank() ||
      attempt_ != request.attempt()) {
    return absl::NotFoundError(absl::StrCat(
        "job ", request.job_id(), " rank ", request.rank(), " attempt ", request.attempt(),
        " is not running here", busy_ ? absl::StrCat(" (running: job ", job_id_, " rank ", rank_,
                                                      " attempt ", attempt_, ")")
                                      : std::string(" (idle)")));
  }
  absl::Status s = runner_->UpdatePartition(request);
  if (s.ok()) {
    Logger("worker")->info("job {} rank {}: partition now also has parts [{}] (lead rank {})",
                           job_id_, rank_, absl::StrJoin(request.partition().also(), ", "),
                           request.lead_rank());
  }
  return s;
}

absl::StatusOr<TaskRunner::ExportFn> WorkerNode::PrepareExport(
    const v1::ExportModelRequest& request) {
  absl::MutexLock l(&mu_);
  if (!busy_ || runner_ == nullptr || job_id_ != request.job_id() || rank_ != request.rank() ||
      attempt_ != request.attempt()) {
    return absl::NotFoundError(absl::StrCat(
        "job ", request.job_id(), " rank ", request.rank(), " attempt ", request.attempt(),
        " is not running here", busy_ ? absl::StrCat(" (running: job ", job_id_, " rank ", rank_,
                                                      " attempt ", attempt_, ")")
                                      : std::string(" (idle)")));
  }
  return runner_->PrepareExport(request.path());
}

v1::WorkerStatus WorkerNode::Status() const {
  v1::WorkerStatus st;
  absl::MutexLock l(&mu_);
  st.set_node_id(agent_ != nullptr ? agent_->node_id() : std::string());
  st.set_device(options_.device);
  st.set_busy(busy_);
  st.set_job_id(job_id_);
  st.set_rank(rank_);
  st.set_attempt(attempt_);
  st.set_last_error(last_error_);
  if (runner_ != nullptr) {
    TaskSnapshot snap = runner_->Snapshot();
    st.set_step(snap.step);
    st.set_samples_per_sec(snap.samples_per_sec);
    st.set_pull_wait_sec(snap.pull_wait_sec);
    st.set_compute_sec(snap.compute_sec);
    st.set_push_sec(snap.push_sec);
    st.set_shard_map_epoch(snap.shard_map_epoch);
    st.set_data_bytes_read(snap.data_bytes_read);
    st.set_data_lines_skipped(snap.data_lines_skipped);
  }
  return st;
}

bool WorkerNode::WaitIdle(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](bool* busy) { return !*busy; }, &busy_),
                              timeout);
}

bool WorkerNode::Report(const v1::WorkerProgress& progress) {
  std::string job;
  uint32_t attempt = 0;
  {
    absl::MutexLock l(&mu_);
    pending_progress_ = progress;
    absl::Time now = absl::Now();
    bool final = progress.done() || !progress.error().empty();
    if (!final && now - last_report_ < options_.report_interval) return true;
    last_report_ = now;
    job = job_id_;
    attempt = attempt_;
  }
  v1::WorkerProgress p = progress;
  p.set_node_id(node_id());
  p.set_attempt(attempt);
  if (scheduler_ == nullptr) {
    Logger("worker")->info("job {} rank {}: step {}/{} epoch {} loss {:.4f} acc {:.4f} test {:.4f}",
                           job, p.rank(), p.step(), p.total_steps(), p.epoch(), p.loss(),
                           p.train_accuracy(), p.test_accuracy());
    return true;
  }
  auto cancel = scheduler_->ReportProgress(job, p);
  if (!cancel.ok()) {
    Logger("worker")->warn("progress report: {}", cancel.status());
    return true;  // Keep training; the scheduler may be restarting.
  }
  return !*cancel;
}

absl::StatusOr<v1::ShardMap> WorkerNode::RefreshShardMap() {
  if (scheduler_ == nullptr) {
    return absl::UnavailableError("standalone worker: no scheduler to refresh the shard map from");
  }
  std::string job;
  {
    absl::MutexLock l(&mu_);
    job = job_id_;
  }
  return scheduler_->GetShardMap(job);
}

}  // namespace pscluster::worker
