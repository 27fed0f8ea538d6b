// Scheduler::RenderMetrics(): the Prometheus text served at /metrics.
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "scheduler/job_state.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {
namespace {

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void Header(std::string* out, const char* name, const char* type, const char* help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

const char* StateName(v1::NodeState s) {
  switch (s) {
    case v1::NODE_ALIVE:
      return "alive";
    case v1::NODE_SUSPECT:
      return "suspect";
    case v1::NODE_DEAD:
      return "dead";
    case v1::NODE_LEFT:
      return "left";
    default:
      return "unknown";
  }
}

}  // namespace

std::string Scheduler::RenderMetrics() const {
  std::string out;
  std::map<std::pair<std::string, std::string>, int> nodes;
  for (const char* role : {"server", "worker"}) {
    for (const char* state : {"alive", "suspect", "dead", "left"}) nodes[{role, state}] = 0;
  }
  for (const v1::NodeStatus& n : registry_.Snapshot()) {
    nodes[{n.info().role() == v1::ROLE_SERVER ? "server" : "worker", StateName(n.state())}]++;
  }
  Header(&out, "pscluster_scheduler_nodes", "gauge", "Registered nodes by role and liveness.");
  for (const auto& [k, v] : nodes) {
    absl::StrAppend(&out, "pscluster_scheduler_nodes{role=\"", k.first, "\",state=\"", k.second,
                    "\"} ", v, "\n");
  }

  std::map<std::string, int> jobs;
  for (v1::JobState s : {v1::JOB_QUEUED, v1::JOB_PLACING, v1::JOB_RUNNING, v1::JOB_SUCCEEDED,
                         v1::JOB_FAILED, v1::JOB_CANCELLED}) {
    jobs[JobStateName(s)] = 0;
  }
  std::string progress;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, rec] : jobs_) {
      jobs[JobStateName(rec.job.state())]++;
      if (rec.job.state() != v1::JOB_RUNNING) continue;
      const v1::JobProgress& p = rec.job.progress();
      std::string labels =
          absl::StrCat("{job=\"", Escape(id), "\",name=\"", Escape(rec.job.spec().name()), "\"}");
      absl::StrAppend(&progress, "pscluster_job_step", labels, " ", p.step(), "\n");
      absl::StrAppend(&progress, "pscluster_job_total_steps", labels, " ", p.total_steps(), "\n");
      absl::StrAppend(&progress, "pscluster_job_samples_per_second", labels, " ",
                      absl::StrFormat("%g", p.samples_per_sec()), "\n");
      absl::StrAppend(&progress, "pscluster_job_loss", labels, " ",
                      absl::StrFormat("%g", p.loss()), "\n");
      absl::StrAppend(&progress, "pscluster_job_test_accuracy", labels, " ",
                      absl::StrFormat("%g", p.test_accuracy()), "\n");
      absl::StrAppend(&progress, "pscluster_job_waiting_for_workers", labels, " ",
                      p.waiting_for_size(), "\n");
    }
  }
  Header(&out, "pscluster_scheduler_jobs", "gauge", "Jobs by lifecycle state.");
  for (const auto& [state, n] : jobs) {
    absl::StrAppend(&out, "pscluster_scheduler_jobs{state=\"", state, "\"} ", n, "\n");
  }
  Header(&out, "pscluster_job_step", "gauge",
         "Running jobs: slowest worker's completed steps (with total_steps, samples_per_second, "
         "loss, test_accuracy, waiting_for_workers beside it).");
  out += progress;
  const std::pair<const char*, uint64_t> counters[] = {
      {"pscluster_scheduler_heartbeats_total", heartbeats_.load()},
      {"pscluster_scheduler_registrations_total", registrations_.load()},
      {"pscluster_scheduler_jobs_submitted_total", submissions_.load()},
      {"pscluster_scheduler_progress_reports_total", progress_reports_.load()}};
  for (const auto& [name, v] : counters) {
    Header(&out, name, "counter", "Calls accepted since the scheduler started.");
    absl::StrAppend(&out, name, " ", v, "\n");
  }
  absl::StrAppend(&out, "# TYPE pscluster_scheduler_info gauge\npscluster_scheduler_info{version=\"",
                  Escape(options_.version), "\"} 1\n");
  return out;
}

}  // namespace pscluster::scheduler
