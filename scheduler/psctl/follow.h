// Following a job live: psctl submit --wait, status --watch and up --local.
#ifndef PSCLUSTER_SCHEDULER_PSCTL_FOLLOW_H_
#define PSCLUSTER_SCHEDULER_PSCTL_FOLLOW_H_

#include <functional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "scheduler/psctl/client.h"
#include "scheduler/psctl/commands.h"

namespace pscluster::psctl {

struct FollowOptions {
  bool detail = false;  // Full job view (status --watch) instead of one line per update.
  // Called on every refresh; a non-OK status stops following with that error (up --local uses
  // it to notice a child process that died).
  std::function<absl::Status()> check;
};

// Polls the job every options.interval until it reaches a final state and returns it. Prints a
// live view: redrawn in place on a terminal, one line per change otherwise. A scheduler that is
// briefly unreachable (restarting) is retried for up to 60 s. CANCELLED when interrupted.
absl::StatusOr<v1::Job> FollowJob(SchedulerClient& client, const std::string& job_id,
                                  const PsctlOptions& options, const FollowOptions& follow,
                                  std::ostream& out);

// "job-3 succeeded in 2m10s: test accuracy 0.8873, model exported to /x.safetensors".
std::string FinalSummary(const v1::Job& job);

}  // namespace pscluster::psctl

#endif  // PSCLUSTER_SCHEDULER_PSCTL_FOLLOW_H_
