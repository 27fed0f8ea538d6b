// `psctl up --local` and `psctl down`: the one-command local cluster.
#ifndef PSCLUSTER_SCHEDULER_PSCTL_UP_COMMAND_H_
#define PSCLUSTER_SCHEDULER_PSCTL_UP_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "scheduler/psctl/commands.h"

namespace pscluster::psctl {

// Starts the cluster, submits the job, shows live progress, prints the final test accuracy and
// the exported model, and stops every child (also on Ctrl-C, exit 130). With --detach the
// cluster keeps running and `psctl down` stops it.
int RunUp(const PsctlOptions& options, std::ostream& out, std::ostream& err);
int RunDown(const PsctlOptions& options, std::ostream& out, std::ostream& err);

// The binary `name` of `package`: `flag_value` when set, else the first executable among
// CandidatePaths(). NOT_FOUND lists where it looked and names `flag`.
absl::StatusOr<std::string> FindBinary(const std::string& flag_value, const std::string& self,
                                       const std::string& package, const std::string& name,
                                       const std::string& flag);

// Default work directory: $TMPDIR (or /tmp) / pscluster-local-<uid>.
std::string DefaultWorkDir();

}  // namespace pscluster::psctl

#endif  // PSCLUSTER_SCHEDULER_PSCTL_UP_COMMAND_H_
