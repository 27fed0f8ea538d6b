// `psctl up --local` and `psctl down`: the one-command local cluster.
#ifndef PSCLUSTER_SCHEDULER_PSCTL_UP_COMMAND_H_
#define PSCLUSTER_SCHEDULER_PSCTL_UP_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "common/tls.h"
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

// What psctl needs to call the detached local cluster in `work_dir`.
struct StateFileAccess {
  std::string token_file;  // psctl's token file.
  TlsFiles tls;            // psctl's certificate, key and the cluster's CA.
};

// psctl's credentials for the detached local cluster in `work_dir` when that cluster's
// scheduler is at `scheduler_address` and was started secured; empty otherwise (no such
// cluster, another address, or started with --insecure).
StateFileAccess StateFileCredentials(const std::string& work_dir,
                                     const std::string& scheduler_address);

}  // namespace pscluster::psctl

#endif  // PSCLUSTER_SCHEDULER_PSCTL_UP_COMMAND_H_
