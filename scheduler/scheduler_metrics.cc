// The scheduler's Prometheus metrics (served at /metrics by the daemon): nodes by role and
// liveness, jobs by state, running jobs' progress, and call counters.
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "scheduler/job_state.h"
#include "scheduler/scheduler_core.h"

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

void SchedulerCore::RegisterMetrics() {
  metrics_.AddGaugeCallback(
      "pscluster_scheduler_nodes", "Registered nodes by role and liveness.", [this] {
        std::map<std::pair<std::string, std::string>, int> nodes;
        for (const char* role : {"server", "worker"}) {
          for (const char* state : {"alive", "suspect", "dead", "left"}) nodes[{role, state}] = 0;
        }
        for (const v1::NodeStatus& n : registry_.Snapshot()) {
          nodes[{n.info().role() == v1::ROLE_SERVER ? "server" : "worker", StateName(n.state())}]++;
        }
        std::vector<Sample> out;
        for (const auto& [k, v] : nodes) {
          out.push_back({absl::StrCat("role=\"", k.first, "\",state=\"", k.second, "\""),
                         static_cast<double>(v)});
        }
        return out;
      });
  metrics_.AddGaugeCallback("pscluster_scheduler_jobs", "Jobs by lifecycle state.", [this] {
    std::map<std::string, int> jobs;
    for (v1::JobState s : {v1::JOB_QUEUED, v1::JOB_PLACING, v1::JOB_RUNNING, v1::JOB_RECOVERING,
                           v1::JOB_SUCCEEDED, v1::JOB_FAILED, v1::JOB_CANCELLED}) {
      jobs[JobStateName(s)] = 0;
    }
    {
      absl::MutexLock l(&mu_);
      for (const JobRecord& rec : jobs_) jobs[JobStateName(rec.job.state())]++;
    }
    std::vector<Sample> out;
    for (const auto& [state, n] : jobs) {
      out.push_back({absl::StrCat("state=\"", state, "\""), static_cast<double>(n)});
    }
    return out;
  });

  // One family per progress field, a sample per running job.
  using Field = double (*)(const v1::JobProgress&);
  const std::tuple<const char*, const char*, Field> fields[] = {
      {"pscluster_job_step", "Running jobs: the slowest worker's completed steps.",
       [](const v1::JobProgress& p) { return static_cast<double>(p.step()); }},
      {"pscluster_job_total_steps", "Running jobs: steps the slowest worker must complete.",
       [](const v1::JobProgress& p) { return static_cast<double>(p.total_steps()); }},
      {"pscluster_job_samples_per_second", "Running jobs: training throughput of all workers.",
       [](const v1::JobProgress& p) { return p.samples_per_sec(); }},
      {"pscluster_job_loss", "Running jobs: mean training loss over the workers.",
       [](const v1::JobProgress& p) { return p.loss(); }},
      {"pscluster_job_test_accuracy", "Running jobs: latest test accuracy (-1 = none yet).",
       [](const v1::JobProgress& p) { return p.test_accuracy(); }},
      {"pscluster_job_waiting_for_workers",
       "Running jobs: workers the others are waiting for (BSP/SSP).",
       [](const v1::JobProgress& p) { return static_cast<double>(p.waiting_for_size()); }}};
  for (const auto& [name, help, field] : fields) {
    metrics_.AddGaugeCallback(name, help, [this, field = field] {
      std::vector<Sample> out;
      absl::MutexLock l(&mu_);
      for (const JobRecord& each : jobs_) {
        const std::string& id = each.job.job_id();
        const v1::Job& job = each.job;
        if (job.state() != v1::JOB_RUNNING) continue;
        out.push_back(
            {absl::StrCat("job=\"", Escape(id), "\",name=\"", Escape(job.spec().name()), "\""),
             field(job.progress())});
      }
      return out;
    });
  }

  const char* kCalls = "Calls accepted since the scheduler started.";
  counters_.heartbeats = metrics_.AddCounter("pscluster_scheduler_heartbeats_total", kCalls);
  counters_.registrations = metrics_.AddCounter("pscluster_scheduler_registrations_total", kCalls);
  counters_.submissions = metrics_.AddCounter("pscluster_scheduler_jobs_submitted_total", kCalls);
  counters_.progress_reports =
      metrics_.AddCounter("pscluster_scheduler_progress_reports_total", kCalls);
  counters_.recoveries =
      metrics_.AddCounter("pscluster_scheduler_job_recoveries_total",
                          "Jobs rolled back to a checkpoint and placed again after losing a node.");
  counters_.handovers =
      metrics_.AddCounter("pscluster_scheduler_rank_handovers_total",
                          "Ranks of lost workers given to another worker with no rollback.");
  counters_.promotions = metrics_.AddCounter(
      "pscluster_scheduler_backup_promotions_total",
      "Lost servers whose shards' backups took over with no rollback (replication > 1).");
  counters_.leaves = metrics_.AddCounter(
      "pscluster_scheduler_rank_leaves_total",
      "Ranks that left their job (worker lost, no idle worker to take the rank): the job went on "
      "with fewer workers and no rollback.");
  counters_.rejoins = metrics_.AddCounter(
      "pscluster_scheduler_rank_rejoins_total",
      "Ranks that had left their job and came back on an idle worker, with no rollback.");
  counters_.backups_dropped = metrics_.AddCounter(
      "pscluster_scheduler_unreachable_backups_dropped_total",
      "Backups dropped from a job's shard map because their primary could not reach them.");
  counters_.backups_replaced = metrics_.AddCounter(
      "pscluster_scheduler_backups_replaced_total",
      "Maps that gave shards a new live backup in place of one dropped as unreachable.");
  counters_.data_rebalances = metrics_.AddCounter(
      "pscluster_scheduler_data_rebalances_total",
      "Times a job's data shares changed to follow its ranks' compute rates (balance_data).");
  counters_.moves_done = metrics_.AddCounter(
      "pscluster_scheduler_shard_moves_total",
      "Virtual shards moved live to another server (MoveShard and the rebalancer).");
  counters_.moves_failed =
      metrics_.AddCounter("pscluster_scheduler_shard_moves_failed_total",
                          "Live shard moves given up (the shard stayed on its server).");
  counters_.store_failures = metrics_.AddCounter(
      "pscluster_scheduler_store_failures_total",
      "Writes to the scheduler's store that failed (each makes the scheduler stop publishing "
      "changes until the store works again).");
  metrics_.AddGaugeCallback(
      "pscluster_scheduler_store_ok",
      "1 while the scheduler's store takes writes; 0 after a write failed, until it works again.",
      [this] {
        absl::MutexLock l(&mu_);
        return std::vector<Sample>{{"", jobs_.error().ok() ? 1.0 : 0.0}};
      });
  metrics_.AddGaugeCallback("pscluster_scheduler_info", "The scheduler's version.", [this] {
    return std::vector<Sample>{{absl::StrCat("version=\"", Escape(options_.version), "\""), 1}};
  });
}

}  // namespace pscluster::scheduler
