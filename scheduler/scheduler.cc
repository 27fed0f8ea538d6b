#include "scheduler/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/path_root.h"
#include "scheduler/job_state.h"
#include "scheduler/membership.h"
#include "scheduler/job_validation.h"
#include "scheduler/job_yaml.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/progress.h"

namespace pscluster::scheduler {
namespace {

constexpr size_t kMaxTokenBytes = 256;

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options, Store* store, const Clock* clock,
                     ClusterRpc* rpc, const PlacementPolicy* placement, bool view)
    : core_(options, store, clock, rpc, placement, view) {
  DefinePasses();
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& options,
                                                             Store* store, const Clock* clock,
                                                             ClusterRpc* rpc,
                                                             const PlacementPolicy* placement) {
  if (options.lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--lease_ms: the lease must be > 0");
  }
  std::unique_ptr<Scheduler> s(new Scheduler(options, store, clock, rpc, placement, false));
  if (absl::Status st = s->core_.Restore(); !st.ok()) return st;
  return s;
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::CreateView(const SchedulerOptions& options,
                                                                 Store* store, const Clock* clock) {
  std::unique_ptr<Scheduler> s(new Scheduler(options, store, clock, nullptr, nullptr, true));
  if (absl::Status st = s->core_.Restore(); !st.ok()) return st;
  return s;
}

Scheduler::~Scheduler() { Stop(); }

absl::Status Scheduler::CheckClusterSize(const v1::JobSpec& spec, const std::string& source) const {
  if (core_.clock().Now() - core_.started() < core_.StartupGrace()) return absl::OkStatus();
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
  std::vector<v1::NodeStatus> servers = core_.registry().Live(v1::ROLE_SERVER);
  if (servers.size() < spec.num_servers()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(source, ": num_servers: the job asks for ", spec.num_servers(),
                     " servers but the cluster has ", servers.size(), " live (", names(servers),
                     "); start more ps_server daemons or lower num_servers"));
  }
  std::vector<v1::NodeStatus> workers;
  for (v1::NodeStatus& w : core_.registry().Live(v1::ROLE_WORKER)) {
    // As pass_helpers.h's WorkerFitsJob (that header is for the passes).
    if (w.info().capacity().gpus() >= spec.gpus_per_worker() &&
        (!spec.has_entrypoint() || w.info().allow_entrypoints())) {
      workers.push_back(std::move(w));
    }
  }
  if (spec.has_entrypoint() && workers.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(source,
                     ": entrypoint: no live worker allows entrypoints (it runs the job's command); "
                     "start ps_worker with --allow_entrypoints"));
  }
  if (workers.size() < spec.num_workers()) {
    std::string gpus = spec.gpus_per_worker() > 0
                           ? absl::StrCat(" with >= ", spec.gpus_per_worker(), " GPUs")
                           : "";
    if (spec.has_entrypoint()) absl::StrAppend(&gpus, " that allow entrypoints");
    return absl::ResourceExhaustedError(
        absl::StrCat(source, ": num_workers: the job asks for ", spec.num_workers(), " workers",
                     gpus, " but the cluster has ", workers.size(), " live (", names(workers),
                     "); start more ps_worker daemons or lower num_workers"));
  }
  return absl::OkStatus();
}

// ---- RPC handlers ----

absl::Status Scheduler::CheckQuotaLocked(const std::string& owner) const {
  if (core_.quotas() == nullptr) return absl::OkStatus();
  const Quota* quota = core_.quotas()->For(owner);
  if (quota == nullptr) return absl::OkStatus();
  std::vector<std::string> unfinished;
  uint64_t bytes = 0;
  for (const JobRecord& rec : core_.jobs()) {
    const std::string& id = rec.job.job_id();
    if (rec.owner != owner || !IsActive(rec.job.state())) continue;
    unfinished.push_back(id);
    bytes += rec.server_bytes;
  }
  const std::string who = owner.empty() ? "(unauthenticated)" : owner;
  const std::string where = absl::StrCat("--quota_file ", core_.quotas()->path(), ":", quota->line);
  if (quota->jobs.has_value() && unfinished.size() >= *quota->jobs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("quota: identity '", who, "' may have at most ", *quota->jobs,
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
        CheckUnderRoot(spec.checkpoint_dir(), core_.options().checkpoint_root, "checkpoint_dir");
    if (!in_root.ok()) return in_root;
  }

  absl::MutexLock l(&core_.mu());
  if (const JobRecord* rec = core_.jobs().FindByToken(req.client_token()); rec != nullptr) {
    resp->set_job_id(rec->job.job_id());
    resp->set_state(rec->job.state());
    return absl::OkStatus();
  }
  if (!core_.jobs().error().ok()) return core_.jobs().error();
  absl::Status s = CheckQuotaLocked(owner);
  if (!s.ok()) return s;
  s = CheckClusterSize(spec, source);
  if (!s.ok()) return s;
  auto n = core_.store().NextId("job");
  if (!n.ok()) {
    core_.jobs().Fail(n.status());
    return core_.jobs().error();
  }
  JobRecord rec;
  rec.client_token = req.client_token();
  rec.owner = owner;
  v1::Job& job = rec.job;
  job.set_job_id(absl::StrCat("job-", *n));
  *job.mutable_spec() = std::move(spec);
  job.set_state(v1::JOB_QUEUED);
  job.set_reason("waiting to be placed");
  job.set_submitted_unix_ms(UnixMs(core_.clock().Now()));
  *job.mutable_progress() = InitialProgress({});
  absl::StatusOr<JobRecord*> added = core_.jobs().Add(std::move(rec));
  if (!added.ok()) return added.status();
  const v1::Job& queued = (*added)->job;
  Log()->info("job {} ({}) queued: {} servers, {} workers{}{}", queued.job_id(),
              queued.spec().name(), queued.spec().num_servers(), queued.spec().num_workers(),
              (*added)->owner.empty() ? "" : ", submitted by ", (*added)->owner);
  resp->set_job_id(queued.job_id());
  resp->set_state(v1::JOB_QUEUED);
  core_.counters().submissions->Add();
  core_.Wake();
  return absl::OkStatus();
}

absl::Status Scheduler::GetJob(const v1::GetJobRequest& req, v1::Job* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  absl::MutexLock l(&core_.mu());
  absl::StatusOr<JobRecord*> found = core_.jobs().FindOrError(req.job_id());
  if (!found.ok()) return found.status();
  const JobRecord* rec = *found;
  *resp = rec->job;
  if (req.include_history()) *resp->mutable_history() = rec->history.history();
  return absl::OkStatus();
}

absl::Status Scheduler::ListJobs(const v1::ListJobsRequest& req, v1::ListJobsResponse* resp) {
  absl::MutexLock l(&core_.mu());
  for (const JobRecord& rec : core_.jobs().NewestFirst()) {
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
  absl::MutexLock l(&core_.mu());
  if (!core_.jobs().error().ok()) return core_.jobs().error();
  absl::StatusOr<JobRecord*> found = core_.jobs().FindOrError(req.job_id());
  if (!found.ok()) return found.status();
  JobRecord* rec = *found;
  if (!IsTerminal(rec->job.state())) {
    core_.Finish(
        *rec, v1::JOB_CANCELLED,
        req.reason().empty() ? "cancelled by a user" : absl::StrCat("cancelled: ", req.reason()));
    if (!core_.jobs().error().ok()) return core_.jobs().error();
  }
  resp->set_state(rec->job.state());
  return absl::OkStatus();
}

absl::Status Scheduler::GetShardMap(const v1::GetShardMapRequest& req, v1::ShardMap* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  absl::MutexLock l(&core_.mu());
  absl::StatusOr<JobRecord*> found = core_.jobs().FindOrError(req.job_id());
  if (!found.ok()) return found.status();
  const JobRecord* rec = *found;
  if (rec->shard_map.epoch() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", req.job_id(), " is ", JobStateName(rec->job.state()), " and has no shard map yet"));
  }
  *resp = rec->shard_map;
  return absl::OkStatus();
}

absl::Status Scheduler::ReportProgress(const v1::ReportProgressRequest& req,
                                       v1::ReportProgressResponse* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  absl::MutexLock l(&core_.mu());
  absl::StatusOr<JobRecord*> found = core_.jobs().FindOrError(req.job_id());
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
  core_.counters().progress_reports->Add();
  v1::WorkerProgress* w = job.mutable_progress()->mutable_workers(p.rank());
  *w = p;
  w->set_node_id(assigned);
  w->set_updated_unix_ms(UnixMs(core_.clock().Now()));
  Summarize(job.spec(), rec->server_waiting_for, job.mutable_progress());
  rec->progress_dirty = true;
  rec->history.Observe(job, core_.clock().Now());
  if (!p.error().empty()) {
    const std::string reason =
        absl::StrCat("worker of rank ", p.rank(), " (", core_.Describe(assigned), "): ", p.error());
    resp->set_cancel(true);
    if (p.retryable() && job.state() == v1::JOB_RUNNING) {
      // Say, a server this worker cannot reach: the rank goes to another worker, as if this
      // one were lost (MayRecover fails the job past the limit).
      if (core_.MayRecover(*rec, reason)) {
        rec->lost_ranks.push_back({p.rank(), reason, /*avoid_node=*/true});
        Log()->warn("job {}: {}; handing its rank over", job.job_id(), reason);
        core_.Wake();
      }
      return absl::OkStatus();
    }
    core_.Finish(*rec, v1::JOB_FAILED, reason);
    return absl::OkStatus();
  }
  if (job.state() == v1::JOB_RUNNING) core_.MaybeSucceed(*rec);
  return absl::OkStatus();
}

absl::Status Scheduler::ClusterStatus(const v1::ClusterStatusRequest& req,
                                      v1::ClusterStatusResponse* resp) {
  std::vector<v1::NodeStatus> nodes = core_.registry().Snapshot();
  std::vector<v1::ShardLoad> loads = core_.registry().ShardLoads();
  absl::MutexLock l(&core_.mu());
  if (!req.job_id().empty()) {
    absl::StatusOr<JobRecord*> found = core_.jobs().FindOrError(req.job_id());
    if (!found.ok()) return found.status();
  }
  absl::flat_hash_map<std::string, std::vector<std::string>> node_jobs;
  for (const JobRecord& each : core_.jobs()) {
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
  for (const JobRecord& rec : core_.jobs().NewestFirst()) {
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
  resp->set_now_unix_ms(UnixMs(core_.clock().Now()));
  resp->set_scheduler_version(core_.options().version);
  return absl::OkStatus();
}

}  // namespace pscluster::scheduler
