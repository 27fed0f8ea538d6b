// The scheduler's node RPCs: RegisterNode, Heartbeat (and the tasks a worker should no longer
// run), Deregister. The registry (scheduler/node_registry.h) keeps the leases; these handlers add
// what a node's arrival or departure means for the jobs.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "scheduler/job_state.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {

absl::Status Scheduler::RegisterNode(const v1::RegisterNodeRequest& req,
                                     v1::RegisterNodeResponse* resp) {
  if (absl::Status s = core_.store_status(); !s.ok()) return s;
  auto reg = core_.registry().Register(req.node());
  if (!reg.ok()) return core_.RegistryError(reg.status());
  core_.counters().registrations->Add();
  resp->set_node_id(reg->node_id);
  resp->set_lease_ms(absl::ToInt64Milliseconds(core_.registry().lease()));
  resp->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(core_.registry().heartbeat_interval()));
  const char* role = req.node().role() == v1::ROLE_SERVER ? "server" : "worker";
  if (reg->is_new) {
    Log()->info("{} {} registered from {}", role, reg->node_id, req.node().address());
  } else {
    Log()->info("{} {} registered again from {}{}", role, reg->node_id, req.node().address(),
                reg->restarted ? " (a new process)" : "");
  }
  absl::MutexLock l(&core_.mu());
  if (reg->restarted) {
    core_.FailJobsOnNode(reg->node_id, "restarted (a new process registered) and lost its work");
  } else if (!reg->is_new && req.node().role() == v1::ROLE_SERVER) {
    // The same process back after its lease lapsed (paused, cut off): its jobs moved away
    // meanwhile, but it may still hold their tables. Drop the copies it should not have.
    const absl::Time now = core_.clock().Now();
    for (const JobRecord& each : core_.jobs()) {
      const std::string& id = each.job.job_id();
      const v1::Job& job = each.job;
      if (IsTerminal(job.state()) &&
          now - absl::FromUnixMillis(job.finished_unix_ms()) >= kRecentlyEnded) {
        continue;
      }
      if (std::find(job.servers().begin(), job.servers().end(), reg->node_id) !=
          job.servers().end()) {
        continue;
      }
      Cleanup c;
      c.drop_job = true;
      c.stale_copy = true;
      c.node_id = reg->node_id;
      c.job_id = id;
      c.reason = "a copy left behind while the server was away";
      c.not_before = absl::InfinitePast();
      core_.cleanups().push_back(std::move(c));
    }
  }
  core_.Wake();
  return absl::OkStatus();
}

absl::Status Scheduler::Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) {
  absl::Status s = core_.registry().Heartbeat(req);
  if (!s.ok()) return s;
  core_.counters().heartbeats->Add();
  resp->set_lease_ms(absl::ToInt64Milliseconds(core_.registry().lease()));
  if (!req.tasks().empty()) StopUnwantedTasks(req);
  return absl::OkStatus();
}

void Scheduler::StopUnwantedTasks(const v1::HeartbeatRequest& req) {
  absl::MutexLock l(&core_.mu());
  for (const v1::WorkerTaskLoad& task : req.tasks()) {
    const JobRecord* rec = core_.jobs().Find(task.job_id());
    const bool wanted = rec != nullptr && HoldsResources(rec->job.state()) &&
                        static_cast<int>(task.rank()) < rec->job.workers_size() &&
                        rec->job.workers(static_cast<int>(task.rank())) == req.node_id();
    if (wanted) continue;
    const bool queued =
        std::any_of(core_.cleanups().begin(), core_.cleanups().end(), [&](const Cleanup& c) {
          return !c.drop_job && c.node_id == req.node_id() && c.job_id == task.job_id();
        });
    if (queued) continue;
    // A task the scheduler no longer wants (its rank was handed over while its worker was cut
    // off, or its job ended meanwhile): stopped, unless the job gives this worker a rank again.
    Cleanup c;
    c.node_id = req.node_id();
    c.job_id = task.job_id();
    c.reason = rec == nullptr ? "the scheduler knows no such job"
                              : absl::StrCat("rank ", task.rank(), " of job ", task.job_id(),
                                             " is no longer this worker's (job ",
                                             JobStateName(rec->job.state()), ")");
    c.not_before = absl::InfinitePast();
    c.stale_copy = true;
    Log()->info("{} still runs a task of job {} rank {}: stopping it ({})", req.node_id(),
                task.job_id(), task.rank(), c.reason);
    core_.cleanups().push_back(std::move(c));
    core_.Wake();
  }
}

absl::Status Scheduler::Deregister(const v1::DeregisterRequest& req) {
  if (absl::Status s = core_.store_status(); !s.ok()) return s;
  absl::Status s = core_.registry().Deregister(req.node_id());
  if (!s.ok()) return core_.RegistryError(s);
  Log()->info("{} left the cluster", req.node_id());
  absl::MutexLock l(&core_.mu());
  core_.FailJobsOnNode(req.node_id(), "left the cluster (deregistered)");
  return absl::OkStatus();
}

}  // namespace pscluster::scheduler
