// The progress pass: what workers reported since a job was last written goes to the store, at
// most every progress_persist_interval per job (a restart loses at most that much progress).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"

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
