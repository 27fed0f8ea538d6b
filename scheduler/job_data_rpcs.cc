// Scheduler::CheckpointJob and ExportJob: on-demand checkpoints and exports of a running job,
// which the scheduler forwards to the job's servers (checkpoint) or its rank-0 worker (export).
#include "absl/strings/str_cat.h"
#include "common/path_root.h"
#include "scheduler/job_state.h"
#include "scheduler/membership.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {

absl::Status Scheduler::CheckpointJob(const v1::CheckpointJobRequest& req,
                                      v1::CheckpointJobResponse* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  if (req.dir().size() > 4096) return absl::InvalidArgumentError("dir: longer than 4096 bytes");
  std::vector<v1::ServerEndpoint> servers;
  std::string dir = req.dir();
  {
    absl::MutexLock l(&core_.mu());
    absl::StatusOr<JobRecord*> found = core_.jobs().FindOrError(req.job_id());
    if (!found.ok()) return found.status();
    JobRecord* rec = *found;
    if (rec->job.state() != v1::JOB_RUNNING) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", req.job_id(), " is ", v1::JobState_Name(rec->job.state()),
                       ": only a running job's servers hold its state"));
    }
    if (dir.empty()) dir = rec->job.spec().checkpoint_dir();
    if (dir.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", req.job_id(), " has no checkpoint_dir: name a directory (psctl checkpoint ",
          req.job_id(), " --dir DIR)"));
    }
    servers.assign(rec->shard_map.servers().begin(), rec->shard_map.servers().end());
  }
  absl::Status in_root = CheckUnderRoot(dir, core_.options().checkpoint_root,
                                        req.dir().empty() ? "checkpoint_dir" : "dir");
  if (!in_root.ok()) return in_root;
  // Outside the lock: each server writes its file (the same call the periodic checkpoints make).
  for (const v1::ServerEndpoint& ep : servers) {
    auto written = core_.rpc().Checkpoint(ep.address(), req.job_id(), dir);
    if (!written.ok()) {
      return absl::Status(written.status().code(),
                          absl::StrCat("server ", ep.node_id(), " (", ep.address(),
                                       "): ", written.status().message()));
    }
    v1::CheckpointFile* f = resp->add_files();
    f->set_server(ep.node_id());
    f->set_path(written->path());
    f->set_step(written->step());
    f->set_bytes(written->bytes());
  }
  Log()->info("job {}: checkpoint on demand into {} ({} files)", req.job_id(), dir,
              resp->files_size());
  return absl::OkStatus();
}

// How long the lead worker may take to write an export: its pull waits until every rank has
// pushed the step, and a large model takes a while to write.
constexpr absl::Duration kExportTimeout = absl::Seconds(120);

absl::Status Scheduler::ExportJob(const v1::ExportJobRequest& req, v1::ExportJobResponse* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  if (req.path().size() > 4096) return absl::InvalidArgumentError("path: longer than 4096 bytes");
  v1::ExportModelRequest call;
  std::string worker;
  {
    absl::MutexLock l(&core_.mu());
    absl::StatusOr<JobRecord*> found = core_.jobs().FindOrError(req.job_id());
    if (!found.ok()) return found.status();
    JobRecord* rec = *found;
    const v1::Job& job = rec->job;
    if (job.state() != v1::JOB_RUNNING) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", req.job_id(), " is ", JobStateName(job.state()),
          job.state() == v1::JOB_SUCCEEDED && !job.export_path().empty()
              ? absl::StrCat(": its model was exported to ", job.export_path(), " at the end")
              : ": only a running job can be exported on demand"));
    }
    std::string path = req.path().empty() ? job.spec().export_path() : req.path();
    if (path.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", req.job_id(), " has no export_path: name a file (psctl export ",
                       req.job_id(), " --to PATH)"));
    }
    const uint32_t lead = LeadRank(job.recovery(), job.progress().workers_size());
    if (lead >= static_cast<uint32_t>(job.workers_size())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", req.job_id(), " has no lead rank to export"));
    }
    worker = job.workers(lead);
    call.set_job_id(req.job_id());
    call.set_rank(lead);
    call.set_attempt(RankAttempt(job.recovery(), lead));
    call.set_path(path);
  }
  std::optional<v1::NodeStatus> node = core_.registry().Get(worker);
  if (!node.has_value() || node->state() != v1::NODE_ALIVE) {
    return absl::UnavailableError(absl::StrCat("the job's lead worker ", worker,
                                               " is not alive; try again after its recovery"));
  }
  // Outside the lock: the worker pulls the model from the servers and writes it.
  auto written = core_.rpc().ExportModel(node->info().address(), call, kExportTimeout);
  if (!written.ok()) {
    return absl::Status(written.status().code(),
                        absl::StrCat("worker ", worker, " (", node->info().address(),
                                     "): ", written.status().message()));
  }
  resp->set_path(written->path());
  resp->set_bytes(written->bytes());
  resp->set_step(written->step());
  resp->set_worker(worker);
  Log()->info("job {}: exported on demand to {} by {} (step {}, {} bytes)", req.job_id(),
              written->path(), worker, written->step(), written->bytes());
  return absl::OkStatus();
}

}  // namespace pscluster::scheduler
