#include "scheduler/testing/fake_nodes.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/channel.h"

namespace pscluster::scheduler::testing {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, grpc::Status status) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(status);
  return r;
}

}  // namespace

// ---- FakeParameterServer ----

grpc::ServerUnaryReactor* FakeParameterServer::UpdateShardMap(
    grpc::CallbackServerContext* ctx, const v1::UpdateShardMapRequest* req,
    v1::UpdateShardMapResponse* resp) {
  absl::MutexLock l(&mu_);
  if (!fail_.ok()) return Done(ctx, fail_);
  updates_.push_back(*req);
  static std::atomic<uint64_t> order{0};
  update_order_.push_back(++order);
  resp->set_epoch(req->map().epoch());
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* FakeParameterServer::DropJob(grpc::CallbackServerContext* ctx,
                                                       const v1::DropJobRequest* req,
                                                       v1::DropJobResponse*) {
  absl::MutexLock l(&mu_);
  dropped_.push_back(req->job_id());
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* FakeParameterServer::CreateTables(grpc::CallbackServerContext* ctx,
                                                            const v1::CreateTablesRequest* req,
                                                            v1::CreateTablesResponse* resp) {
  absl::MutexLock l(&mu_);
  created_.push_back(*req);
  resp->set_created(req->tables_size());
  return Done(ctx, grpc::Status::OK);
}

std::vector<v1::CreateTablesRequest> FakeParameterServer::created() const {
  absl::MutexLock l(&mu_);
  return created_;
}

grpc::ServerUnaryReactor* FakeParameterServer::Status(grpc::CallbackServerContext* ctx,
                                                      const v1::ServerStatusRequest* req,
                                                      v1::ServerStatus* resp) {
  absl::MutexLock l(&mu_);
  for (const auto& u : updates_) {
    if (!req->job_id().empty() && u.map().job_id() != req->job_id()) continue;
    v1::JobOnServer* j = resp->add_jobs();
    j->set_job_id(u.map().job_id());
    j->set_epoch(u.map().epoch());
    for (uint32_t r : waiting_for_) j->add_waiting_for(r);
    j->set_waiting_pulls(waiting_for_.empty() ? 0 : 1);
    for (size_t w = 0; w < clocks_.size(); ++w) {
      v1::WorkerClock* c = j->add_clocks();
      c->set_worker(w);
      c->set_clock(clocks_[w]);
    }
    for (const std::string& b : unreachable_) j->add_unreachable_backups(b);
    // The tables declared here (as a worker's CreateTables would have: one dense table "w").
    v1::TableStatus* t = j->add_tables();
    t->set_name("w");
    t->set_kind(v1::DENSE);
    t->mutable_spec()->set_name("w");
    t->mutable_spec()->set_kind(v1::DENSE);
    t->mutable_spec()->mutable_shape()->add_dims(16);
    if (all_caught_up_) {
      for (auto it = updates_.rbegin(); it != updates_.rend(); ++it) {
        if (it->map().job_id() != u.map().job_id()) continue;
        for (const v1::ReplicaSeed& seed : it->copy_from()) {
          v1::ReplicaOnServer* r = j->add_replicas();
          r->set_primary(seed.primary());
          r->set_seeded(true);
          r->set_caught_up(true);
        }
        break;
      }
    }
    if (!copy_of_.empty()) {
      v1::ReplicaOnServer* r = j->add_replicas();
      r->set_primary(copy_of_);
      r->set_seeded(copy_caught_up_);
      r->set_caught_up(copy_caught_up_);
    }
    break;
  }
  return Done(ctx, grpc::Status::OK);
}

void FakeParameterServer::SetUnreachableBackups(std::vector<std::string> addresses) {
  absl::MutexLock l(&mu_);
  unreachable_ = std::move(addresses);
}

void FakeParameterServer::SetAllCopiesCaughtUp(bool on) {
  absl::MutexLock l(&mu_);
  all_caught_up_ = on;
}

void FakeParameterServer::SetCopyOf(const std::string& primary, bool caught_up) {
  absl::MutexLock l(&mu_);
  copy_of_ = primary;
  copy_caught_up_ = caught_up;
}

grpc::ServerUnaryReactor* FakeParameterServer::Checkpoint(grpc::CallbackServerContext* ctx,
                                                          const v1::CheckpointRequest* req,
                                                          v1::CheckpointResponse* resp) {
  absl::MutexLock l(&mu_);
  checkpoints_.push_back(*req);
  resp->set_path(req->dir() + "/" + req->job_id() + "/fake-step0.ckpt");
  return Done(ctx, grpc::Status::OK);
}

std::vector<v1::CheckpointRequest> FakeParameterServer::checkpoints() const {
  absl::MutexLock l(&mu_);
  return checkpoints_;
}

grpc::ServerUnaryReactor* FakeParameterServer::FenceWorker(grpc::CallbackServerContext* ctx,
                                                           const v1::FenceWorkerRequest* req,
                                                           v1::FenceWorkerResponse* resp) {
  absl::MutexLock l(&mu_);
  fences_.push_back(*req);
  if (req->rejoin()) {  // The slowest of the set clocks, the rank's own left out (0: none).
    int64_t min = -1;
    for (size_t w = 0; w < clocks_.size(); ++w) {
      if (w != req->worker() && (min < 0 || clocks_[w] < min)) min = clocks_[w];
    }
    resp->set_clock(std::max<int64_t>(0, min));
    resp->set_attempt(req->attempt());
    return Done(ctx, grpc::Status::OK);
  }
  if (req->leave()) {  // As a server that never saw the rank push: clock 0.
    resp->set_clock(req->worker() < clocks_.size() ? clocks_[req->worker()] : 0);
    resp->set_attempt(~0u);
    return Done(ctx, grpc::Status::OK);
  }
  if (req->worker() >= clocks_.size()) {
    return Done(ctx, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no clock for the rank"));
  }
  resp->set_clock(clocks_[req->worker()]);
  resp->set_attempt(req->attempt());
  return Done(ctx, grpc::Status::OK);
}

void FakeParameterServer::FailUpdates(grpc::Status status) {
  absl::MutexLock l(&mu_);
  fail_ = status;
}

void FakeParameterServer::SetWaitingFor(std::vector<uint32_t> ranks) {
  absl::MutexLock l(&mu_);
  waiting_for_ = std::move(ranks);
}

void FakeParameterServer::SetClocks(std::vector<int64_t> clocks) {
  absl::MutexLock l(&mu_);
  clocks_ = std::move(clocks);
}

std::vector<v1::UpdateShardMapRequest> FakeParameterServer::updates() const {
  absl::MutexLock l(&mu_);
  return updates_;
}

uint64_t FakeParameterServer::UpdateOrder(uint64_t epoch) const {
  absl::MutexLock l(&mu_);
  for (size_t i = 0; i < updates_.size(); ++i) {
    if (updates_[i].map().epoch() == epoch) return update_order_[i];
  }
  return 0;
}

std::vector<v1::FenceWorkerRequest> FakeParameterServer::fences() const {
  absl::MutexLock l(&mu_);
  return fences_;
}

std::vector<std::string> FakeParameterServer::dropped() const {
  absl::MutexLock l(&mu_);
  return dropped_;
}

// ---- FakeWorker ----

FakeWorker::FakeWorker(std::string scheduler_address, SimulatedTraining training)
    : scheduler_address_(std::move(scheduler_address)), training_(std::move(training)) {}

FakeWorker::~FakeWorker() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (task_.joinable()) task_.join();
}

grpc::ServerUnaryReactor* FakeWorker::AssignTask(grpc::CallbackServerContext* ctx,
                                                 const v1::AssignTaskRequest* req,
                                                 v1::AssignTaskResponse*) {
  {
    absl::MutexLock l(&mu_);
    if (busy_) {
      return Done(ctx, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                    absl::StrCat("busy with job ", job_id_)));
    }
    busy_ = true;
    stop_ = false;
    job_id_ = req->job_id();
    rank_ = req->rank();
    attempt_ = req->attempt();
    lead_rank_ = req->lead_rank();
    step_ = req->start_step();
    assigned_.push_back(*req);
  }
  if (task_.joinable()) task_.join();  // The previous task has ended (busy_ was false).
  if (training_.run && !scheduler_address_.empty()) {
    task_ = std::thread([this, task = *req] { Train(task); });
  }
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* FakeWorker::StopTask(grpc::CallbackServerContext* ctx,
                                               const v1::StopTaskRequest* req,
                                               v1::StopTaskResponse*) {
  absl::MutexLock l(&mu_);
  stopped_.push_back(*req);
  if (busy_ && job_id_ == req->job_id()) {
    stop_ = true;
    if ((!training_.run || scheduler_address_.empty()) && !hold_on_stop_) busy_ = false;
  }
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* FakeWorker::UpdateShardMap(grpc::CallbackServerContext* ctx,
                                                     const v1::WorkerShardMapRequest* req,
                                                     v1::WorkerShardMapResponse* resp) {
  resp->set_epoch(req->map().epoch());
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* FakeWorker::UpdatePartition(grpc::CallbackServerContext* ctx,
                                                      const v1::UpdatePartitionRequest* req,
                                                      v1::UpdatePartitionResponse*) {
  absl::MutexLock l(&mu_);
  if (!busy_ || job_id_ != req->job_id() || rank_ != req->rank() ||
      attempt_ != req->attempt()) {
    return Done(ctx, grpc::Status(grpc::StatusCode::NOT_FOUND, "no such task here"));
  }
  partition_updates_.push_back(*req);
  lead_rank_ = req->lead_rank();
  return Done(ctx, grpc::Status::OK);
}

std::vector<v1::UpdatePartitionRequest> FakeWorker::partition_updates() const {
  absl::MutexLock l(&mu_);
  return partition_updates_;
}

grpc::ServerUnaryReactor* FakeWorker::Status(grpc::CallbackServerContext* ctx,
                                             const v1::WorkerStatusRequest*,
                                             v1::WorkerStatus* resp) {
  absl::MutexLock l(&mu_);
  resp->set_node_id(node_id_);
  resp->set_device("cpu (simulated)");
  resp->set_busy(busy_);
  resp->set_job_id(job_id_);
  resp->set_rank(rank_);
  resp->set_attempt(attempt_);
  resp->set_step(step_);
  return Done(ctx, grpc::Status::OK);
}

void FakeWorker::set_node_id(const std::string& id) {
  absl::MutexLock l(&mu_);
  node_id_ = id;
}

std::vector<v1::AssignTaskRequest> FakeWorker::assigned() const {
  absl::MutexLock l(&mu_);
  return assigned_;
}

std::vector<v1::StopTaskRequest> FakeWorker::stopped() const {
  absl::MutexLock l(&mu_);
  return stopped_;
}

bool FakeWorker::busy() const {
  absl::MutexLock l(&mu_);
  return busy_;
}

void FakeWorker::FinishTask() {
  absl::MutexLock l(&mu_);
  busy_ = false;
}

void FakeWorker::HoldOnStop(bool hold) {
  absl::MutexLock l(&mu_);
  hold_on_stop_ = hold;
}

void FakeWorker::JoinTask() {
  if (task_.joinable()) task_.join();
}

void FakeWorker::Train(v1::AssignTaskRequest task) {
  auto channel = MakeChannel(scheduler_address_);
  if (!channel.ok()) return;
  auto stub = v1::Scheduler::NewStub(*channel);
  const SimulatedTraining& t = training_;
  auto stopped = [this] {
    absl::MutexLock l(&mu_);
    return stop_;
  };
  for (int64_t step = task.start_step() + 1; step <= t.total_steps && !stopped(); ++step) {
    absl::SleepFor(t.step_time);
    {
      absl::MutexLock l(&mu_);
      step_ = step;
    }
    bool fail = step == t.fail_at_step;
    bool done = step == t.total_steps && !fail;
    if (step % t.report_every != 0 && !fail && !done) continue;
    v1::ReportProgressRequest req;
    req.set_job_id(task.job_id());
    v1::WorkerProgress* p = req.mutable_progress();
    p->set_rank(task.rank());
    p->set_attempt(task.attempt());
    {
      absl::MutexLock l(&mu_);
      p->set_node_id(node_id_);
    }
    p->set_step(step);
    p->set_total_steps(t.total_steps);
    p->set_epoch(done ? std::max(1u, task.spec().epochs()) : 0);
    p->set_loss(1.0 / step);
    p->set_train_accuracy(std::min(0.99, 0.5 + 0.02 * step));
    p->set_samples_per_sec(task.spec().batch_size() / absl::ToDoubleSeconds(t.step_time));
    p->set_test_accuracy(done ? t.test_accuracy : -1);
    p->set_test_loss(done ? 0.3 : -1);
    p->set_done(done);
    if (fail) p->set_error(t.error);
    bool lead;
    {
      absl::MutexLock l(&mu_);
      lead = lead_rank_ == task.rank();
    }
    if (done && lead) {
      std::string path = task.spec().export_path();
      if (path.empty() && !t.export_dir.empty()) {
        path = absl::StrCat(t.export_dir, "/", task.job_id(), ".safetensors");
      }
      p->set_export_path(path);
    }
    // Keep trying through a scheduler restart.
    while (!stopped()) {
      auto ctx = CallContext(absl::Seconds(2));
      v1::ReportProgressResponse resp;
      grpc::Status s = stub->ReportProgress(ctx.get(), req, &resp);
      if (s.ok()) {
        if (resp.cancel()) {
          absl::MutexLock l(&mu_);
          stop_ = true;
        }
        break;
      }
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
          s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (fail) break;
  }
  absl::MutexLock l(&mu_);
  busy_ = false;
}

// ---- FakeNode ----

absl::StatusOr<std::unique_ptr<FakeNode>> FakeNode::Start(const FakeNodeOptions& options) {
  std::unique_ptr<FakeNode> n(new FakeNode());
  n->options_ = options;
  std::vector<grpc::Service*> services;
  if (options.role == v1::ROLE_SERVER) {
    n->ps_ = std::make_unique<FakeParameterServer>();
    services.push_back(n->ps_.get());
  } else {
    n->worker_ = std::make_unique<FakeWorker>(options.scheduler_address, options.training);
    services.push_back(n->worker_.get());
  }
  GrpcServerOptions so;
  so.listen_address = options.listen_address;
  so.port_file = options.port_file;
  so.component = options.role == v1::ROLE_SERVER ? "fake-server" : "fake-worker";
  auto server = GrpcServer::Start(so, services);
  if (!server.ok()) return server.status();
  n->server_ = std::move(*server);
  if (!options.scheduler_address.empty()) {
    n->heartbeats_ = std::thread([p = n.get()] { p->HeartbeatLoop(); });
  }
  return n;
}

FakeNode::~FakeNode() { Stop(); }

void FakeNode::HeartbeatLoop() {
  auto channel = MakeChannel(options_.scheduler_address);
  if (!channel.ok()) return;
  auto stub = v1::Scheduler::NewStub(*channel);
  while (true) {
    std::string id;
    {
      absl::MutexLock l(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&wake), options_.heartbeat_interval)) return;
      if (paused_) continue;
      id = node_id_;
    }
    auto ctx = CallContext(absl::Seconds(2));
    bool need_register = id.empty();
    if (!need_register) {
      v1::HeartbeatRequest hb;
      hb.set_node_id(id);
      v1::HeartbeatResponse resp;
      grpc::Status s = stub->Heartbeat(ctx.get(), hb, &resp);
      need_register = s.error_code() == grpc::StatusCode::NOT_FOUND;
    }
    if (need_register) {
      v1::RegisterNodeRequest req;
      v1::NodeInfo* info = req.mutable_node();
      info->set_node_id(id);
      info->set_role(options_.role);
      info->set_address(server_->address());
      *info->mutable_capacity() = options_.capacity;
      info->set_hostname("localhost");
      info->set_pid(getpid());
      info->set_version("fake");
      v1::RegisterNodeResponse resp;
      auto rctx = CallContext(absl::Seconds(2));
      if (stub->RegisterNode(rctx.get(), req, &resp).ok()) {
        absl::MutexLock l(&mu_);
        node_id_ = resp.node_id();
        if (worker_) worker_->set_node_id(resp.node_id());
      }
    }
  }
}

std::string FakeNode::node_id() const {
  absl::MutexLock l(&mu_);
  return node_id_;
}

bool FakeNode::WaitRegistered(absl::Duration timeout) const {
  absl::MutexLock l(&mu_);
  auto has_id = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !node_id_.empty(); };
  return mu_.AwaitWithTimeout(absl::Condition(&has_id), timeout);
}

void FakeNode::PauseHeartbeats() {
  absl::MutexLock l(&mu_);
  paused_ = true;
}

void FakeNode::Crash() {
  if (stopped_) return;
  stopped_ = true;
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (heartbeats_.joinable()) heartbeats_.join();
  server_->Shutdown(absl::ZeroDuration());
}

void FakeNode::Stop() {
  if (stopped_) return;
  std::string id = node_id();
  if (!id.empty() && !options_.scheduler_address.empty()) {
    auto channel = MakeChannel(options_.scheduler_address);
    if (channel.ok()) {
      auto stub = v1::Scheduler::NewStub(*channel);
      auto ctx = CallContext(absl::Seconds(1));
      v1::DeregisterRequest req;
      req.set_node_id(id);
      v1::DeregisterResponse resp;
      (void)stub->Deregister(ctx.get(), req, &resp);
    }
  }
  Crash();
}

}  // namespace pscluster::scheduler::testing
