// The lease pass: nodes that stopped heartbeating are dead; their jobs recover and their ranks
// are handed over (SchedulerCore::FailJobsOnNode).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"

namespace pscluster::scheduler {
namespace {

class LeasePass final : public Pass {
 public:
  explicit LeasePass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "leases"; }
  void Run() override;

 private:
  SchedulerCore& core_;
};

}  // namespace

void LeasePass::Run() {
  std::vector<std::string> died = core_.registry().ExpireLeases();
  if (died.empty()) return;
  absl::MutexLock l(&core_.mu());
  for (const std::string& id : died) {
    Log()->warn("{} stopped heartbeating: lease of {} expired", core_.Describe(id),
                absl::FormatDuration(core_.options().lease));
    core_.FailJobsOnNode(id,
                         absl::StrCat("stopped heartbeating (lease of ",
                                      absl::FormatDuration(core_.options().lease), " expired)"));
  }
}

std::unique_ptr<Pass> MakeLeasePass(SchedulerCore& core) {
  return std::make_unique<LeasePass>(core);
}

}  // namespace pscluster::scheduler
