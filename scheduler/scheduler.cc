#include "scheduler/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/path_root.h"
#include "scheduler/job_state.h"
#include "scheduler/job_validation.h"
#include "scheduler/job_yaml.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/progress.h"

namespace pscluster::scheduler {
namespace {

constexpr size_t kMaxTokenBytes = 256;

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options, Store* store, const Clock* clock,
                     ClusterRpc* rpc, const PlacementPolicy* placement)
    : options_(options),
      store_(store),
      clock_(clock),
      rpc_(rpc),
      placement_(placement),
      registry_(RegistryOptions{options.lease}, clock, store),
      started_(clock->Now()),
      jobs_(store, clock, [this](const absl::Status& cause) { OnStoreFailed(cause); }) {
  RegisterMetrics();
  DefinePasses();
  absl::MutexLock l(&mu_);
  quotas_ = options.quotas;
}

void Scheduler::SetQuotas(std::shared_ptr<const Quotas> quotas) {
  absl::MutexLock l(&mu_);
  quotas_ = std::move(quotas);
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& options,
                                                             Store* store, const Clock* clock,
                                                             ClusterRpc* rpc,
                                                             const PlacementPolicy* placement) {
  if (options.lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--lease_ms: the lease must be > 0");
  }
  std::unique_ptr<Scheduler> s(new Scheduler(options, store, clock, rpc, placement));
  absl::Status st = s->registry_.Restore();
  if (st.ok()) st = s->Restore();
  if (!st.ok()) return st;
  return s;
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::CreateView(const SchedulerOptions& options,
                                                                 Store* store,
                                                                 const Clock* clock) {
  std::unique_ptr<Scheduler> s(new Scheduler(options, store, clock, nullptr, nullptr));
  s->view_ = true;
  absl::Status st = s->registry_.Restore();
  if (st.ok()) st = s->Restore();
  if (!st.ok()) return st;
  return s;
}

Scheduler::~Scheduler() { Stop(); }

absl::Status Scheduler::Restore() {
  auto stored = store_->LoadJobs();
  if (!stored.ok()) return stored.status();
  absl::MutexLock l(&mu_);
  LoadJobsLocked(std::move(*stored));
  return absl::OkStatus();
}

void Scheduler::LoadJobsLocked(std::vector<StoredJob> stored) {
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

void Scheduler::OnStoreFailed(const absl::Status& cause) {
  next_store_retry_ = clock_->Now() + options_.store_retry;
  store_failures_->Add();
  Log()->error("store {} failed: {}; publishing nothing until it works again", store_->path(),
               cause);
  if (serving_changed_) serving_changed_(false);
}

absl::Status Scheduler::RegistryError(const absl::Status& s) {
  // The registry's own refusals name a field (INVALID_ARGUMENT) or a node (NOT_FOUND); anything
  // else came from the store.
  if (s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kNotFound) {
    return s;
  }
  absl::MutexLock l(&mu_);
  jobs_.Fail(s);
  return jobs_.error();
}

absl::Status Scheduler::store_status() const {
  absl::MutexLock l(&mu_);
  return jobs_.error();
}

void Scheduler::OnServingChanged(std::function<void(bool)> f) { serving_changed_ = std::move(f); }

bool Scheduler::StoreWorks() {
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

std::string Scheduler::Describe(const std::string& node_id) const {
  auto n = registry_.Get(node_id);
  if (!n.has_value()) return node_id;
  return absl::StrCat(node_id, " at ", n->info().address());
}

void Scheduler::Wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { wake_ = true; }

void Scheduler::QueueCleanups(const JobRecord& rec, const std::string& reason) {
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

void Scheduler::Finish(JobRecord& rec, v1::JobState state, const std::string& reason) {
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
  Log()->log(log, "job {} {}{}{}", rec.job.job_id(), JobStateName(state), reason.empty() ? "" : ": ",
             reason);
  Wake();
}

void Scheduler::FailJobsOnNode(const std::string& node_id, const std::string& what) {
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

bool Scheduler::CanPromote(const JobRecord& rec, const std::string& node) const {
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

bool Scheduler::MayRecover(JobRecord& rec, const std::string& reason) {
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

void Scheduler::StartRecovery(JobRecord& rec, const std::string& reason) {
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

absl::Duration Scheduler::StartupGrace() const {
  return options_.startup_grace > absl::ZeroDuration() ? options_.startup_grace : options_.lease;
}

absl::Status Scheduler::CheckClusterSize(const v1::JobSpec& spec,
                                         const std::string& source) const {
  if (clock_->Now() - started_ < StartupGrace()) return absl::OkStatus();
  auto names = [](const std::vector<v1::NodeStatus>& nodes) {
    std::vector<std::string> ids;
    for (const auto& n : nodes) ids.push_back(n.info().node_id());
    std::sort(ids.begin(), ids.end());
    if (ids.size() > 8) {
      size_t more = ids.size() - 8;
      ids.resize(8);
      ids.push_back(absl::StrCat("... ", more, " more"));
    }
    return ids.empty() ? std::string("none") : absl::StrJoin(ids, ", ");
  };
  std::vector<v1::NodeStatus> servers = registry_.Live(v1::ROLE_SERVER);
  if (servers.size() < spec.num_servers()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        source, ": num_servers: the job asks for ", spec.num_servers(),
        " servers but the cluster has ", servers.size(), " live (", names(servers),
        "); start more ps_server daemons or lower num_servers"));
  }
  std::vector<v1::NodeStatus> workers;
  for (v1::NodeStatus& w : registry_.Live(v1::ROLE_WORKER)) {
    // As pass_helpers.h's WorkerFitsJob (that header is for the passes).
    if (w.info().capacity().gpus() >= spec.gpus_per_worker() &&
        (!spec.has_entrypoint() || w.info().allow_entrypoints())) {
      workers.push_back(std::move(w));
    }
  }
  if (spec.has_entrypoint() && workers.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        source, ": entrypoint: no live worker allows entrypoints (it runs the job's command); "
        "start ps_worker with --allow_entrypoints"));
  }
  if (workers.size() < spec.num_workers()) {
    std::string gpus = spec.gpus_per_worker() > 0
                           ? absl::StrCat(" with >= ", spec.gpus_per_worker(), " GPUs")
                           : "";
    if (spec.has_entrypoint()) absl::StrAppend(&gpus, " that allow entrypoints");
    return absl::ResourceExhaustedError(absl::StrCat(
        source, ": num_workers: the job asks for ", spec.num_workers(), " workers", gpus,
        " but the cluster has ", workers.size(), " live (", names(workers),
        "); start more ps_worker daemons or lower num_workers"));
  }
  return absl::OkStatus();
}

// ---- RPC handlers ----

absl::Status Scheduler::CheckQuotaLocked(const std::string& owner) const {
  if (quotas_ == nullptr) return absl::OkStatus();
  const Quota* quota = quotas_->For(owner);
  if (quota == nullptr) return absl::OkStatus();
  std::vector<std::string> unfinished;
  uint64_t bytes = 0;
  for (const JobRecord& rec : jobs_) {
    const std::string& id = rec.job.job_id();
    if (rec.owner != owner || !IsActive(rec.job.state())) continue;
    unfinished.push_back(id);
    bytes += rec.server_bytes;
  }
  const std::string who = owner.empty() ? "(unauthenticated)" : owner;
  const std::string where = absl::StrCat("--quota_file ", quotas_->path(), ":", quota->line);
  if (quota->jobs.has_value() && unfinished.size() >= *quota->jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "quota: identity '", who, "' may have at most ", *quota->jobs,
        " unfinished jobs (", where, "); it has ", unfinished.size(),
        unfinished.empty() ? "" : ": ", absl::StrJoin(unfinished, ", ")));
  }
  if (quota->server_memory.has_value() && bytes >= *quota->server_memory) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "quota: identity '", who, "' may hold at most ", BytesText(*quota->server_memory),
        " of server memory (", where, "); its running jobs hold ", bytes,
        " bytes on their servers (", absl::StrJoin(unfinished, ", "), ")"));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::SubmitJob(const v1::SubmitJobRequest& req, v1::SubmitJobResponse* resp) {
  return SubmitJob(req, resp, "");
}

absl::Status Scheduler::SubmitJob(const v1::SubmitJobRequest& req, v1::SubmitJobResponse* resp,
                                  const std::string& owner) {
  std::string source = req.source().empty() ? "job spec" : req.source();
  if (req.client_token().size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_token: longer than ", kMaxTokenBytes, " bytes"));
  }
  v1::JobSpec spec;
  switch (req.spec_case()) {
    case v1::SubmitJobRequest::kYaml: {
      auto parsed = LoadJobYaml(req.yaml(), source);
      if (!parsed.ok()) return parsed.status();
      spec = std::move(*parsed);
      break;
    }
    case v1::SubmitJobRequest::kJob: {
      absl::Status s = ValidateJobSpec(req.job(), JobSource(source));
      if (!s.ok()) return s;
      spec = req.job();
      ApplyJobDefaults(&spec);
      break;
    }
    default:
      return absl::InvalidArgumentError("spec: give the job as yaml text or as a JobSpec");
  }
  // The scheduler reads the job's checkpoints after a lost node: only under its root.
  if (!spec.checkpoint_dir().empty()) {
    absl::Status in_root =
        CheckUnderRoot(spec.checkpoint_dir(), options_.checkpoint_root, "checkpoint_dir");
    if (!in_root.ok()) return in_root;
  }

  absl::MutexLock l(&mu_);
  if (const JobRecord* rec = jobs_.FindByToken(req.client_token()); rec != nullptr) {
    resp->set_job_id(rec->job.job_id());
    resp->set_state(rec->job.state());
    return absl::OkStatus();
  }
  if (!jobs_.error().ok()) return jobs_.error();
  absl::Status s = CheckQuotaLocked(owner);
  if (!s.ok()) return s;
  s = CheckClusterSize(spec, source);
  if (!s.ok()) return s;
  auto n = store_->NextId("job");
  if (!n.ok()) {
    jobs_.Fail(n.status());
    return jobs_.error();
  }
  JobRecord rec;
  rec.client_token = req.client_token();
  rec.owner = owner;
  v1::Job& job = rec.job;
  job.set_job_id(absl::StrCat("job-", *n));
  *job.mutable_spec() = std::move(spec);
  job.set_state(v1::JOB_QUEUED);
  job.set_reason("waiting to be placed");
  job.set_submitted_unix_ms(UnixMs(clock_->Now()));
  *job.mutable_progress() = InitialProgress({});
  absl::StatusOr<JobRecord*> added = jobs_.Add(std::move(rec));
  if (!added.ok()) return added.status();
  const v1::Job& queued = (*added)->job;
  Log()->info("job {} ({}) queued: {} servers, {} workers{}{}", queued.job_id(),
              queued.spec().name(), queued.spec().num_servers(), queued.spec().num_workers(),
              (*added)->owner.empty() ? "" : ", submitted by ", (*added)->owner);
  resp->set_job_id(queued.job_id());
  resp->set_state(v1::JOB_QUEUED);
  submissions_->Add();
  Wake();
  return absl::OkStatus();
}

absl::Status Scheduler::GetJob(const v1::GetJobRequest& req, v1::Job* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  absl::MutexLock l(&mu_);
  absl::StatusOr<JobRecord*> found = jobs_.FindOrError(req.job_id());
  if (!found.ok()) return found.status();
  const JobRecord* rec = *found;
  *resp = rec->job;
  if (req.include_history()) *resp->mutable_history() = rec->history.history();
  return absl::OkStatus();
}

absl::Status Scheduler::ListJobs(const v1::ListJobsRequest& req, v1::ListJobsResponse* resp) {
  absl::MutexLock l(&mu_);
  for (const JobRecord& rec : jobs_.NewestFirst()) {
    if (!req.include_finished() && IsTerminal(rec.job.state())) continue;
    *resp->add_jobs() = rec.job;
  }
  return absl::OkStatus();
}

absl::Status Scheduler::CancelJob(const v1::CancelJobRequest& req, v1::CancelJobResponse* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  if (req.reason().size() > 4096) {
    return absl::InvalidArgumentError("reason: longer than 4096 bytes");
  }
  absl::MutexLock l(&mu_);
  if (!jobs_.error().ok()) return jobs_.error();
  absl::StatusOr<JobRecord*> found = jobs_.FindOrError(req.job_id());
  if (!found.ok()) return found.status();
  JobRecord* rec = *found;
  if (!IsTerminal(rec->job.state())) {
    Finish(*rec, v1::JOB_CANCELLED,
           req.reason().empty() ? "cancelled by a user" : absl::StrCat("cancelled: ", req.reason()));
    if (!jobs_.error().ok()) return jobs_.error();
  }
  resp->set_state(rec->job.state());
  return absl::OkStatus();
}

absl::Status Scheduler::GetShardMap(const v1::GetShardMapRequest& req, v1::ShardMap* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  absl::MutexLock l(&mu_);
  absl::StatusOr<JobRecord*> found = jobs_.FindOrError(req.job_id());
  if (!found.ok()) return found.status();
  const JobRecord* rec = *found;
  if (rec->shard_map.epoch() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("job ", req.job_id(), " is ",
                                                      JobStateName(rec->job.state()),
                                                      " and has no shard map yet"));
  }
  *resp = rec->shard_map;
  return absl::OkStatus();
}

absl::Status Scheduler::ReportProgress(const v1::ReportProgressRequest& req,
                                       v1::ReportProgressResponse* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  absl::MutexLock l(&mu_);
  absl::StatusOr<JobRecord*> found = jobs_.FindOrError(req.job_id());
  if (!found.ok()) return found.status();
  JobRecord* rec = *found;
  v1::Job& job = rec->job;
  if (!HoldsResources(job.state())) {
    // Finished, or queued again after a failed placement: the task has nothing to do.
    resp->set_cancel(job.state() != v1::JOB_SUCCEEDED);
    return absl::OkStatus();
  }
  const v1::WorkerProgress& p = req.progress();
  if (job.state() == v1::JOB_RECOVERING) {
    // A task of a placement that a recovery replaces: it stops, and what it says is moot.
    resp->set_cancel(true);
    return absl::OkStatus();
  }
  absl::Status s = CheckWorkerProgress(p, job.progress().workers_size());
  if (!s.ok()) return s;
  if (p.attempt() != RankAttempt(job.recovery(), p.rank())) {
    // A task that a rollback or a hand-over replaced: it stops, and what it says is moot.
    resp->set_cancel(true);
    return absl::OkStatus();
  }
  const std::string& assigned = job.workers(p.rank());
  if (!p.node_id().empty() && p.node_id() != assigned) {
    Log()->warn("job {}: rank {} reported by {}, but it runs on {}: told to stop", job.job_id(),
                p.rank(), p.node_id(), assigned);
    resp->set_cancel(true);
    return absl::OkStatus();
  }
  progress_reports_->Add();
  v1::WorkerProgress* w = job.mutable_progress()->mutable_workers(p.rank());
  *w = p;
  w->set_node_id(assigned);
  w->set_updated_unix_ms(UnixMs(clock_->Now()));
  Summarize(job.spec(), rec->server_waiting_for, job.mutable_progress());
  rec->progress_dirty = true;
  rec->history.Observe(job, clock_->Now());
  if (!p.error().empty()) {
    const std::string reason =
        absl::StrCat("worker of rank ", p.rank(), " (", Describe(assigned), "): ", p.error());
    resp->set_cancel(true);
    if (p.retryable() && job.state() == v1::JOB_RUNNING) {
      // Say, a server this worker cannot reach: the rank goes to another worker, as if this
      // one were lost (MayRecover fails the job past the limit).
      if (MayRecover(*rec, reason)) {
        rec->lost_ranks.push_back({p.rank(), reason, /*avoid_node=*/true});
        Log()->warn("job {}: {}; handing its rank over", job.job_id(), reason);
        Wake();
      }
      return absl::OkStatus();
    }
    Finish(*rec, v1::JOB_FAILED, reason);
    return absl::OkStatus();
  }
  if (job.state() == v1::JOB_RUNNING) MaybeSucceed(*rec);
  return absl::OkStatus();
}

void Scheduler::MaybeSucceed(JobRecord& rec) {
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

absl::Status Scheduler::ClusterStatus(const v1::ClusterStatusRequest& req,
                                      v1::ClusterStatusResponse* resp) {
  std::vector<v1::NodeStatus> nodes = registry_.Snapshot();
  std::vector<v1::ShardLoad> loads = registry_.ShardLoads();
  absl::MutexLock l(&mu_);
  if (!req.job_id().empty()) {
    absl::StatusOr<JobRecord*> found = jobs_.FindOrError(req.job_id());
    if (!found.ok()) return found.status();
  }
  absl::flat_hash_map<std::string, std::vector<std::string>> node_jobs;
  for (const JobRecord& each : jobs_) {
    const std::string& id = each.job.job_id();
    const v1::Job& job = each.job;
    if (!HoldsResources(job.state())) continue;
    for (const std::string& n : job.servers()) node_jobs[n].push_back(id);
    for (const std::string& n : job.workers()) node_jobs[n].push_back(id);
  }
  std::sort(nodes.begin(), nodes.end(), [](const v1::NodeStatus& a, const v1::NodeStatus& b) {
    if (a.info().role() != b.info().role()) return a.info().role() < b.info().role();
    if (a.info().node_id().size() != b.info().node_id().size()) {
      return a.info().node_id().size() < b.info().node_id().size();  // server-2 before server-10
    }
    return a.info().node_id() < b.info().node_id();
  });
  for (v1::NodeStatus& n : nodes) {
    for (const std::string& j : node_jobs[n.info().node_id()]) n.add_jobs(j);
    *resp->add_nodes() = std::move(n);
  }
  for (const JobRecord& rec : jobs_.NewestFirst()) {
    if (!req.job_id().empty() && rec.job.job_id() != req.job_id()) continue;
    v1::Job* job = resp->add_jobs();
    *job = rec.job;
    if (req.include_history()) *job->mutable_history() = rec.history.history();
  }
  std::sort(loads.begin(), loads.end(), [](const v1::ShardLoad& a, const v1::ShardLoad& b) {
    if (a.load().bytes_per_sec() != b.load().bytes_per_sec()) {
      return a.load().bytes_per_sec() > b.load().bytes_per_sec();
    }
    return a.load().requests_per_sec() > b.load().requests_per_sec();
  });
  for (v1::ShardLoad& s : loads) {
    if (!req.job_id().empty() && s.job_id() != req.job_id()) continue;
    *resp->add_shard_loads() = std::move(s);
  }
  resp->set_now_unix_ms(UnixMs(clock_->Now()));
  resp->set_scheduler_version(options_.version);
  return absl::OkStatus();
}

}  // namespace pscluster::scheduler
