// Scheduler::GetTaskLogs: psctl logs asks the scheduler, which knows the worker of each rank and
// forwards the request to it (the worker keeps the lines; worker/task_logs.h).
#include <optional>

#include "absl/strings/str_cat.h"
#include "scheduler/job_state.h"
#include "scheduler/membership.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {

absl::Status Scheduler::GetTaskLogs(const v1::TaskLogsRequest& req, v1::TaskLogsResponse* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  if (req.max_lines() > 10000) {
    return absl::InvalidArgumentError("max_lines: must be at most 10000 (0 = 1000)");
  }
  std::string worker;
  {
    absl::MutexLock l(&core_.mu());
    absl::StatusOr<JobRecord*> found = core_.jobs().FindOrError(req.job_id());
    if (!found.ok()) return found.status();
    JobRecord* rec = *found;
    const v1::Job& job = rec->job;
    if (!job.spec().has_entrypoint()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", req.job_id(), " has no entrypoint: its workers log to their own log files"));
    }
    if (req.rank() >= job.spec().num_workers()) {
      return absl::NotFoundError(absl::StrCat("rank: ", req.rank(), " is not a rank of job ",
                                              req.job_id(), " (it has ", job.spec().num_workers(),
                                              ")"));
    }
    if (req.rank() >= static_cast<uint32_t>(job.workers_size())) {
      return absl::NotFoundError(absl::StrCat("job ", req.job_id(), " rank ", req.rank(),
                                              " has not been placed on a worker yet (",
                                              JobStateName(job.state()), ")"));
    }
    worker = job.workers(req.rank());
  }
  std::optional<v1::NodeStatus> node = core_.registry().Get(worker);
  if (!node.has_value() || !IsLive(*node)) {
    return absl::UnavailableError(absl::StrCat("worker ", worker, " of job ", req.job_id(),
                                               " rank ", req.rank(),
                                               " is not alive: its lines are out of reach"));
  }
  // Outside the lock: a short call to the worker (the scheduler's RPC timeout).
  auto got = core_.rpc().GetTaskLogs(node->info().address(), req);
  if (!got.ok()) {
    return absl::Status(got.status().code(),
                        absl::StrCat("worker ", worker, " (", node->info().address(),
                                     "): ", got.status().message()));
  }
  *resp = std::move(*got);
  resp->set_worker(worker);
  return absl::OkStatus();
}

}  // namespace pscluster::scheduler
