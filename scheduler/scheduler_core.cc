#include "scheduler/scheduler_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "scheduler/job_state.h"
#include "scheduler/membership.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/progress.h"

namespace pscluster::scheduler {
namespace {

// Moves a job keeps in its record (the newest).
constexpr int kMovesKept = 16;
// A third failed move of an elastic change stops it.
constexpr uint32_t kMaxFailedMoves = 3;

}  // namespace

SchedulerCore::SchedulerCore(const SchedulerOptions& options, Store* store, const Clock* clock,
                             ClusterRpc* rpc, const PlacementPolicy* placement, bool view)
    : options_(options),
      store_(store),
      clock_(clock),
      rpc_(rpc),
      placement_(placement),
      view_(view),
      registry_(RegistryOptions{options.lease}, clock, store),
      started_(clock->Now()),
      jobs_(store, clock, [this](const absl::Status& cause) { OnStoreFailed(cause); }) {
  RegisterMetrics();
  absl::MutexLock l(&mu_);
  quotas_ = options.quotas;
}

void SchedulerCore::SetQuotas(std::shared_ptr<const Quotas> quotas) {
  absl::MutexLock l(&mu_);
  quotas_ = std::move(quotas);
}

bool SchedulerCore::TakeMovesWanted() {
  const bool wanted = moves_wanted_;
  moves_wanted_ = false;
  return wanted;
}

void SchedulerCore::SetStopping(bool stopping) {
  absl::MutexLock l(&mu_);
  stopping_ = stopping;
}

bool SchedulerCore::WaitForWork(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wake_ || stopping_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (stopping_) return false;
  wake_ = false;
  return true;
}

bool SchedulerCore::WaitForMoves(absl::Duration idle) {
  absl::MutexLock l(&mu_);
  auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || moves_wanted_; };
  absl::Duration wait = idle;
  if (options_.rebalance_every > absl::ZeroDuration()) {
    wait = std::min(wait, std::max(absl::ZeroDuration(), next_rebalance_ - clock_->Now()));
  }
  mu_.AwaitWithTimeout(absl::Condition(&due), wait);
  return !stopping_;
}

bool SchedulerCore::WaitUnlessStopping(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
  return !mu_.AwaitWithTimeout(absl::Condition(&stop), timeout);
}

absl::Status SchedulerCore::Restore() {
  if (absl::Status s = registry_.Restore(); !s.ok()) return s;
  auto stored = store_->LoadJobs();
  if (!stored.ok()) return stored.status();
  absl::MutexLock l(&mu_);
  LoadJobsLocked(std::move(*stored));
  return absl::OkStatus();
}

void SchedulerCore::LoadJobsLocked(std::vector<StoredJob> stored) {
  absl::Time now = clock_->Now();
  int active = 0;
  for (StoredJob& sj : stored) {
    JobRecord rec;
    rec.job = std::move(sj.job);
    rec.client_token = std::move(sj.client_token);
    rec.owner = std::move(sj.owner);
    rec.shard_map = std::move(sj.shard_map);
    rec.last_persist = now;
    if (rec.job.state() == v1::JOB_PLACING) rec.placement_pending = true;
    if (rec.job.state() == v1::JOB_RUNNING) verify_tasks_ = true;
    if (IsTerminal(rec.job.state())) rec.job.mutable_progress()->clear_waiting_for();
    if (IsActive(rec.job.state())) ++active;
    JobRecord& loaded = jobs_.Load(std::move(rec));
    if (!view_ && IsTerminal(loaded.job.state()) &&
        now - absl::FromUnixMillis(loaded.job.finished_unix_ms()) < kRecentlyEnded) {
      QueueCleanups(loaded, loaded.job.reason());
    }
  }
  if (!stored.empty() && !view_) {
    Log()->info("restored {} jobs ({} active) from {}", stored.size(), active, store_->path());
  }
}

void SchedulerCore::OnStoreFailed(const absl::Status& cause) {
  next_store_retry_ = clock_->Now() + options_.store_retry;
  counters_.store_failures->Add();
  Log()->error("store {} failed: {}; publishing nothing until it works again", store_->path(),
               cause);
  if (serving_changed_) serving_changed_(false);
}

absl::Status SchedulerCore::RegistryError(const absl::Status& s) {
  // The registry's own refusals name a field (INVALID_ARGUMENT) or a node (NOT_FOUND); anything
  // else came from the store.
  if (s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kNotFound) {
    return s;
  }
  absl::MutexLock l(&mu_);
  jobs_.Fail(s);
  return jobs_.error();
}

absl::Status SchedulerCore::store_status() const {
  absl::MutexLock l(&mu_);
  return jobs_.error();
}

bool SchedulerCore::StoreWorks() {
  absl::MutexLock l(&mu_);
  if (jobs_.error().ok()) return true;
  if (clock_->Now() < next_store_retry_) return false;
  next_store_retry_ = clock_->Now() + options_.store_retry;
  // A write first (every node's record), then the jobs as the store holds them: what a failed
  // write left out was never published, and is dropped here, as a restart would drop it.
  absl::Status s = registry_.PersistAll();
  absl::StatusOr<std::vector<StoredJob>> stored = s.ok() ? store_->LoadJobs() : s;
  if (!stored.ok()) {
    Log()->warn("store {} still fails: {}", store_->path(), stored.status());
    return false;
  }
  jobs_.ClearError();
  jobs_.Clear();
  cleanups_.clear();
  LoadJobsLocked(std::move(*stored));
  Log()->info("store {} works again; carrying on from what it holds, as after a restart",
              store_->path());
  if (serving_changed_) serving_changed_(true);
  Wake();
  return true;
}

std::string SchedulerCore::Describe(const std::string& node_id) const {
  auto n = registry_.Get(node_id);
  if (!n.has_value()) return node_id;
  return absl::StrCat(node_id, " at ", n->info().address());
}

void SchedulerCore::QueueCleanups(const JobRecord& rec, const std::string& reason) {
  const v1::Job& job = rec.job;
  // Workers are stopped first; the servers drop the job once they have (or after a grace).
  const bool stopping = job.state() != v1::JOB_SUCCEEDED;
  if (stopping) {
    for (const std::string& w : job.workers()) {
      Cleanup c;
      c.node_id = w;
      c.job_id = job.job_id();
      c.reason = reason;
      c.not_before = absl::InfinitePast();
      cleanups_.push_back(std::move(c));
    }
  }
  for (const std::string& s : job.servers()) {
    Cleanup c;
    c.drop_job = true;
    c.node_id = s;
    c.job_id = job.job_id();
    c.reason = reason;
    c.not_before = absl::InfinitePast();
    if (stopping) {
      c.stopping_workers.assign(job.workers().begin(), job.workers().end());
      c.stop_deadline = clock_->Now() + options_.task_stop_grace;
    }
    cleanups_.push_back(std::move(c));
  }
}

void SchedulerCore::Finish(JobRecord& rec, v1::JobState state, const std::string& reason) {
  absl::Status t = CheckTransition(rec.job.state(), state);
  if (!t.ok()) {
    Log()->error("job {}: {}", rec.job.job_id(), t);
    return;
  }
  bool held = HoldsResources(rec.job.state());
  rec.job.set_state(state);
  rec.job.set_reason(reason);
  rec.job.set_finished_unix_ms(UnixMs(clock_->Now()));
  rec.placement_pending = false;
  // A finished job waits for no one.
  rec.server_waiting_for.clear();
  rec.job.mutable_progress()->clear_waiting_for();
  // Not written: nothing of it is published (the store's recovery reloads the job as it was).
  if (!jobs_.Persist(rec).ok()) return;
  if (held) QueueCleanups(rec, reason);
  auto log = state == v1::JOB_SUCCEEDED ? spdlog::level::info : spdlog::level::warn;
  Log()->log(log, "job {} {}{}{}", rec.job.job_id(), JobStateName(state),
             reason.empty() ? "" : ": ", reason);
  Wake();
}

void SchedulerCore::FailJobsOnNode(const std::string& node_id, const std::string& what) {
  for (JobRecord& rec : jobs_) {
    const std::string& id = rec.job.job_id();
    if (!HoldsResources(rec.job.state())) continue;
    std::string role;
    int lost_rank = -1;
    for (int r = 0; r < rec.job.workers_size(); ++r) {
      if (rec.job.workers(r) == node_id) {
        role = absl::StrCat("worker of rank ", r);
        lost_rank = r;
      }
    }
    bool server = false;
    for (const std::string& s : rec.job.servers()) {
      if (s == node_id) server = true;
    }
    if (server) role = "server holding shards";
    if (role.empty()) continue;
    std::string reason = absl::StrCat(role, " ", Describe(node_id), " ", what);
    if (rec.job.state() == v1::JOB_RUNNING && !server) {
      // The control loop hands the rank to another worker (or rolls the job back).
      if (!MayRecover(rec, reason)) continue;
      rec.lost_ranks.push_back({static_cast<uint32_t>(lost_rank), reason});
      Log()->warn("job {}: {}; handing its rank over", id, reason);
      Wake();
    } else if (rec.job.state() == v1::JOB_RUNNING) {
      // With replicas of everything it held, its backups take over with no rollback.
      rec.promote_lost = CanPromote(rec, node_id) ? node_id : "";
      StartRecovery(rec, reason);
    } else if (rec.job.state() == v1::JOB_RECOVERING) {
      // Already on its way back; this node is not used again (and a second lost server makes
      // it roll back).
      if (server) rec.promote_lost.clear();
      Log()->warn("job {} (recovering): {}", id, reason);
    } else {
      // Still placing: place it again, elsewhere.
      rec.job.set_state(v1::JOB_QUEUED);
      rec.job.set_reason(absl::StrCat("placing again: ", reason));
      // The placement in flight (or the next one) rolls back whatever it reached.
      rec.placement_pending = false;
      rec.job.clear_workers();
      rec.job.clear_servers();
      if (!jobs_.Persist(rec).ok()) return;
      Wake();
    }
  }
}

bool SchedulerCore::CanPromote(const JobRecord& rec, const std::string& node) const {
  const v1::JobSpec& spec = rec.job.spec();
  // Aggregated steps buffered on a lost primary are not in its copies.
  if (spec.replication() <= 1 || spec.consistency().aggregate()) return false;
  for (const v1::ShardAssignment& a : rec.shard_map.assignments()) {
    if (a.primary() != node) continue;
    bool copy = false;
    for (const std::string& b : a.backups()) {
      auto n = registry_.Get(b);
      copy = copy || (b != node && n.has_value() &&
                      (n->state() == v1::NODE_ALIVE || n->state() == v1::NODE_SUSPECT));
    }
    if (!copy) return false;
  }
  return rec.shard_map.assignments_size() > 0;
}

bool SchedulerCore::MayRecover(JobRecord& rec, const std::string& reason) {
  const v1::JobRecovery& r = rec.job.recovery();
  const uint32_t done = r.recoveries() + r.handovers() + r.promotions();
  if (static_cast<int64_t>(done) < options_.max_recoveries) return true;
  Finish(rec, v1::JOB_FAILED,
         options_.max_recoveries <= 0
             ? reason
             : absl::StrCat(reason, " (not recovered: it already recovered ", done,
                            done == 1 ? " time" : " times", ", the --max_recoveries limit)"));
  return false;
}

void SchedulerCore::StartRecovery(JobRecord& rec, const std::string& reason) {
  v1::Job& job = rec.job;
  if (!MayRecover(rec, reason)) return;
  rec.lost_ranks.clear();
  job.set_state(v1::JOB_RECOVERING);
  job.set_reason(absl::StrCat("recovering: ", reason));
  job.mutable_recovery()->set_last_cause(reason);
  rec.server_waiting_for.clear();
  job.mutable_progress()->clear_waiting_for();
  if (!jobs_.Persist(rec).ok()) return;
  Log()->warn("job {} recovering: {}", job.job_id(), reason);
  Wake();
}

absl::Duration SchedulerCore::StartupGrace() const {
  return options_.startup_grace > absl::ZeroDuration() ? options_.startup_grace : options_.lease;
}

void SchedulerCore::MaybeSucceed(JobRecord& rec) {
  v1::Job& job = rec.job;
  for (const v1::WorkerProgress& w : job.progress().workers()) {
    if (!w.done()) return;
  }
  const uint32_t lead = LeadRank(job.recovery(), job.progress().workers_size());
  const std::string& path = job.progress().workers(lead).export_path();
  job.set_export_path(path);
  if (path.empty() && !job.spec().export_path().empty()) {
    Log()->warn("job {}: rank {} finished without reporting the exported model", job.job_id(),
                lead);
  }
  Finish(rec, v1::JOB_SUCCEEDED, "");
}

absl::Status SchedulerCore::QueueMove(JobRecord& rec, uint32_t shard, const std::string& from,
                                      const std::string& to, const std::string& reason,
                                      v1::ShardMove* queued) {
  const v1::Job& job = rec.job;
  if (job.state() != v1::JOB_RUNNING || rec.shard_map.epoch() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("job_id: job ", job.job_id(), " is ",
                                                      JobStateName(job.state()),
                                                      "; only a running job's shards move"));
  }
  if (job.spec().consistency().aggregate()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job_id: job ", job.job_id(),
                     " aggregates its pushes (consistency.aggregate); its "
                     "shards do not move live"));
  }
  for (const v1::ShardMove& m : job.moves()) {
    if (m.state() == v1::MOVE_QUEUED || m.state() == v1::MOVE_COPYING) {
      return absl::FailedPreconditionError(
          absl::StrCat("job_id: job ", job.job_id(), " is already moving shard ", m.shard(),
                       " from ", m.from(), " to ", m.to(), "; one move at a time"));
    }
  }
  if (shard >= rec.shard_map.num_virtual_shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard: ", shard, " is out of range (job ", job.job_id(), " has ",
                     rec.shard_map.num_virtual_shards(), " virtual shards)"));
  }
  // A server outside the job's map joins it with the move (it gets the job's tables first).
  std::optional<v1::NodeStatus> target = registry_.Get(to);
  if (!target.has_value() || target->info().role() != v1::ROLE_SERVER) {
    return absl::NotFoundError(absl::StrCat("to: no server '", to, "'"));
  }
  if (target->state() != v1::NODE_ALIVE) {
    return absl::FailedPreconditionError(
        absl::StrCat("to: server ", to, " is ", v1::NodeState_Name(target->state())));
  }
  if (target->drain() != v1::NODE_IN_SERVICE) {
    return absl::FailedPreconditionError(absl::StrCat(
        "to: server ", to, " is ", target->drain() == v1::NODE_DRAINING ? "draining" : "drained",
        "; nothing moves onto it (psctl undrain first)"));
  }
  v1::ShardMap& map = rec.shard_map;
  const v1::ShardAssignment* a = AssignmentOf(map, shard);
  if (a == nullptr) return absl::InternalError("the job's shard map lacks a shard");  // Own bug.
  const bool backup = !from.empty() && from != a->primary();
  if (backup && !Holds(a->backups(), from)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "from: server '", from, "' holds no copy of shard ", shard, " of job ", job.job_id(),
        " (primary ", a->primary(),
        a->backups().empty() ? "" : absl::StrCat(", backups ", absl::StrJoin(a->backups(), ", ")),
        ")"));
  }
  if (a->primary() == to || Holds(a->backups(), to)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "to: ", to, " already holds ", a->primary() == to ? "shard " : "a backup of shard ", shard,
        " of job ", job.job_id()));
  }
  v1::ShardMove move;
  move.set_shard(shard);
  move.set_from(backup ? from : a->primary());
  move.set_backup(backup);
  move.set_to(to);
  move.set_state(v1::MOVE_QUEUED);
  move.set_reason(reason);
  move.set_requested_unix_ms(absl::ToUnixMillis(clock_->Now()));
  auto* moves = rec.job.mutable_moves();
  *moves->Add() = move;
  if (moves->size() > kMovesKept) moves->DeleteSubrange(0, moves->size() - kMovesKept);
  if (absl::Status p = jobs_.Persist(rec); !p.ok()) return p;
  WantMoves();
  *queued = move;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SchedulerCore::NextEpoch(const JobRecord& rec, uint64_t current) {
  if (!jobs_.error().ok()) return jobs_.error();
  absl::StatusOr<uint64_t> epoch = store_->NextEpoch(rec.job.job_id(), current);
  if (!epoch.ok()) {
    jobs_.Fail(epoch.status());
    return jobs_.error();
  }
  return *epoch;
}

void SchedulerCore::CountElasticMove(JobRecord& rec, const v1::ShardMove& move, bool done) {
  if (!rec.job.has_elastic()) return;  // Never scaled nor drained: nothing to count.
  v1::ElasticChange* c = rec.job.mutable_elastic();
  if (!c->active() || move.reason().rfind(kElasticReason, 0) != 0 ||
      move.requested_unix_ms() < c->requested_unix_ms()) {
    return;
  }
  if (done) {
    c->set_moves_done(c->moves_done() + 1);
    return;
  }
  c->set_moves_failed(c->moves_failed() + 1);
  if (c->moves_failed() >= kMaxFailedMoves) {
    c->set_active(false);
    c->set_finished_unix_ms(absl::ToUnixMillis(clock_->Now()));
    c->set_result(
        absl::StrCat("stopped: ", c->moves_failed(), " moves failed, the last: ", move.result()));
    Log()->warn("job {}: {} stopped: {}", rec.job.job_id(), c->reason(), c->result());
  }
}

bool SchedulerCore::WorkerStillRuns(const std::vector<std::string>& workers,
                                    const std::string& job_id) {
  std::atomic<bool> any{false};
  ParallelFor(workers.size(), [&](size_t i) {
    auto node = registry_.Get(workers[i]);
    if (!node.has_value() || !IsLive(*node)) return;
    auto ws = rpc_->WorkerStatus(node->info().address());
    // An unreachable worker cannot be waited for.
    if (ws.ok() && ws->busy() && ws->job_id() == job_id) any = true;
  });
  return any.load();
}

void SchedulerCore::RollBack(const std::string& job_id, const std::vector<std::string>& servers,
                             const std::vector<std::string>& workers, const std::string& reason) {
  for (const std::string& node : workers) {
    auto st = registry_.Get(node);
    if (!st.has_value() || !IsLive(*st)) continue;
    absl::Status s = rpc_->StopTask(st->info().address(), job_id, reason);
    if (!s.ok()) Log()->warn("job {}: undoing the task on {}: {}", job_id, node, s);
  }
  for (const std::string& node : servers) {
    auto st = registry_.Get(node);
    if (!st.has_value() || !IsLive(*st)) continue;
    absl::Status s = rpc_->DropJob(st->info().address(), job_id);
    if (!s.ok()) Log()->warn("job {}: dropping it on {}: {}", job_id, node, s);
  }
}

}  // namespace pscluster::scheduler
