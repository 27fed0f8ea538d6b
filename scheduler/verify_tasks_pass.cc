// The verify-tasks pass: once after a restart (past the start-up grace), the workers of running
// jobs are asked whether they still run their tasks; a rank whose worker does not (a task handed
// out just before the scheduler died, or one that ended unseen) is lost and handed over.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/membership.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"

namespace pscluster::scheduler {
namespace {

class VerifyTasksPass final : public Pass {
 public:
  explicit VerifyTasksPass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "verify_tasks"; }
  void Run() override;

 private:
  SchedulerCore& core_;
};

}  // namespace

void VerifyTasksPass::Run() {
  struct Check {
    std::string job_id;
    uint32_t rank = 0;
    uint32_t attempt = 0;
    std::string node, address;
  };
  std::vector<Check> checks;
  {
    absl::MutexLock l(&core_.mu());
    // Nodes re-register and heartbeat first.
    if (!core_.verify_tasks() || core_.clock().Now() - core_.started() < core_.StartupGrace()) {
      return;
    }
    core_.clear_verify_tasks();
    for (const JobRecord& each : core_.jobs()) {
      const std::string& id = each.job.job_id();
      const v1::Job& job = each.job;
      if (job.state() != v1::JOB_RUNNING) continue;
      for (int r = 0; r < job.workers_size(); ++r) {
        if (r < job.progress().workers_size() && job.progress().workers(r).done()) continue;
        auto node = core_.registry().Get(job.workers(r));
        if (!node.has_value() || !IsLive(*node)) continue;  // The lease deals with those.
        checks.push_back(Check{id, static_cast<uint32_t>(r),
                               RankAttempt(job.recovery(), static_cast<uint32_t>(r)),
                               job.workers(r), node->info().address()});
      }
    }
  }
  std::vector<std::string> gone(checks.size());
  ParallelFor(checks.size(), [&](size_t i) {
    const Check& c = checks[i];
    auto ws = core_.rpc().WorkerStatus(c.address);
    if (!ws.ok()) return;  // Unreachable: its lease decides.
    if (ws->busy() && ws->job_id() == c.job_id && ws->rank() == c.rank &&
        ws->attempt() == c.attempt) {
      return;
    }
    gone[i] = ws->busy() ? absl::StrCat("runs job ", ws->job_id(), " rank ", ws->rank(),
                                        " attempt ", ws->attempt(), " instead of its task")
                         : std::string("runs no task");
  });
  absl::MutexLock l(&core_.mu());
  for (size_t i = 0; i < checks.size(); ++i) {
    if (gone[i].empty()) continue;
    const Check& c = checks[i];
    JobRecord* rec = core_.jobs().Find(c.job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RUNNING ||
        static_cast<int>(c.rank) >= rec->job.workers_size() || rec->job.workers(c.rank) != c.node ||
        (static_cast<int>(c.rank) < rec->job.progress().workers_size() &&
         rec->job.progress().workers(c.rank).done())) {
      continue;  // Finished or changed meanwhile.
    }
    std::string reason = absl::StrCat("worker of rank ", c.rank, " ", core_.Describe(c.node), " ",
                                      gone[i], " (found after a scheduler restart)");
    if (!core_.MayRecover(*rec, reason)) continue;
    rec->lost_ranks.push_back({c.rank, reason});
    Log()->warn("job {}: {}; handing its rank over", c.job_id, reason);
    core_.Wake();
  }
}

std::unique_ptr<Pass> MakeVerifyTasksPass(SchedulerCore& core) {
  return std::make_unique<VerifyTasksPass>(core);
}

}  // namespace pscluster::scheduler
