// The progress pass: what workers reported since a job was last written goes to the store, at
// most every progress_persist_interval per job (a restart loses at most that much progress).
#include <algorithm>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/job_state.h"
#include "scheduler/membership.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"
#include "scheduler/progress.h"
#include "scheduler/recovery.h"

namespace pscluster::scheduler {
namespace {

class ProgressPass final : public Pass {
 public:
  explicit ProgressPass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "persist_progress"; }
  void Run() override;

 private:
  SchedulerCore& core_;
};

}  // namespace

void ProgressPass::Run() {
  absl::Time now = core_.clock().Now();
  absl::MutexLock l(&core_.mu());
  for (JobRecord& rec : core_.jobs()) {
    if (rec.progress_dirty && now - rec.last_persist >= core_.options().progress_persist_interval &&
        !core_.jobs().Persist(rec).ok()) {
      return;  // The store failed (logged); progress is written again once it works.
    }
  }
}

std::unique_ptr<Pass> MakeProgressPass(SchedulerCore& core) {
  return std::make_unique<ProgressPass>(core);
}

}  // namespace pscluster::scheduler
