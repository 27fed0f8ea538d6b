// The cleanup pass: the calls that free an ended job's nodes (SchedulerCore::QueueCleanups and
// the stale copies and tasks the handlers find): every StopTask first, then every DropJob, each
// server waiting while the job's workers still stop their tasks (up to task_stop_grace).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/job_state.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"

namespace pscluster::scheduler {
namespace {

// A cleanup (StopTask, DropJob) that fails is retried while its node stays live, 1 s after the
// first failure, then twice as long each time up to 30 s; a warning after the third failure. (A
// node that is gone needs none: a server that comes back is told to drop what it should not
// hold when it registers again.)
constexpr int kCleanupWarnAfter = 3;
constexpr absl::Duration kCleanupRetry = absl::Seconds(1);
constexpr absl::Duration kCleanupRetryMax = absl::Seconds(30);

class CleanupPass final : public Pass {
 public:
  explicit CleanupPass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "cleanups"; }
  void Run() override;

 private:
  SchedulerCore& core_;
};

}  // namespace

void CleanupPass::Run() {
  std::vector<Cleanup> due;
  absl::Time now = core_.clock().Now();
  {
    absl::MutexLock l(&core_.mu());
    std::deque<Cleanup> later;
    while (!core_.cleanups().empty()) {
      Cleanup c = std::move(core_.cleanups().front());
      core_.cleanups().pop_front();
      const JobRecord* rec = core_.jobs().Find(c.job_id);
      // A job placed again since holds these nodes anew: leave them alone. A stale copy or
      // task is left alone only if the job holds that very node again.
      if (rec != nullptr && HoldsResources(rec->job.state())) {
        const auto& nodes = c.drop_job ? rec->job.servers() : rec->job.workers();
        if (!c.stale_copy || std::find(nodes.begin(), nodes.end(), c.node_id) != nodes.end()) {
          continue;
        }
      }
      if (c.not_before > now) {
        later.push_back(std::move(c));
      } else {
        due.push_back(std::move(c));
      }
    }
    core_.cleanups() = std::move(later);
  }
  // Tasks are stopped before the job is dropped on the servers.
  std::stable_partition(due.begin(), due.end(), [](const Cleanup& c) { return !c.drop_job; });
  auto run = [&](size_t i) {
    Cleanup& c = due[i];
    auto node = core_.registry().Get(c.node_id);
    if (!node.has_value() || !IsLive(*node)) return;  // Gone: nothing to free there.
    const std::string& addr = node->info().address();
    if (c.drop_job && now < c.stop_deadline &&
        core_.WorkerStillRuns(c.stopping_workers, c.job_id)) {
      c.not_before = now + kStopRecheck;  // Not an attempt: the workers are stopping.
      absl::MutexLock l(&core_.mu());
      core_.cleanups().push_back(std::move(c));
      return;
    }
    absl::Status s = c.drop_job ? core_.rpc().DropJob(addr, c.job_id)
                                : core_.rpc().StopTask(addr, c.job_id, c.reason);
    if (s.ok()) return;
    if (++c.attempts == kCleanupWarnAfter) {
      Log()->warn("job {}: {} at {} failed {} times (last: {}); retrying while the node is live",
                  c.job_id, c.drop_job ? "DropJob" : "StopTask", c.node_id, c.attempts, s);
    }
    c.not_before =
        now + std::min(kCleanupRetryMax, kCleanupRetry * (1 << std::min(c.attempts - 1, 5)));
    absl::MutexLock l(&core_.mu());
    core_.cleanups().push_back(std::move(c));
  };
  const size_t stops =
      std::count_if(due.begin(), due.end(), [](const Cleanup& c) { return !c.drop_job; });
  ParallelFor(stops, run);
  ParallelFor(due.size() - stops, [&](size_t i) { run(stops + i); });
}

std::unique_ptr<Pass> MakeCleanupPass(SchedulerCore& core) {
  return std::make_unique<CleanupPass>(core);
}

}  // namespace pscluster::scheduler
