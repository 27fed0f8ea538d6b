// psctl logs JOB [--rank N] [--follow]: the stdout and stderr lines of an entrypoint job's tasks,
// read through the scheduler from the worker of each rank (Scheduler.GetTaskLogs). stdout lines
// go to psctl's stdout and stderr lines to its stderr, each prefixed "[rank N] " when more than
// one rank is shown. --follow polls every --interval until the job has ended and every rank's
// last lines are printed; a rank that moves to another worker, or starts a new attempt, is
// announced and read from its beginning there.
#ifndef PSCLUSTER_SCHEDULER_PSCTL_LOGS_COMMAND_H_
#define PSCLUSTER_SCHEDULER_PSCTL_LOGS_COMMAND_H_

#include <ostream>
#include <string>

#include "scheduler/psctl/client.h"
#include "scheduler/psctl/commands.h"

namespace pscluster::psctl {

// Exit code as RunPsctl's: 0, 1 (the job is unknown, or no rank's lines could be read and the
// job is not following), 2 (a bad --rank), 130 (interrupted).
int RunLogs(const PsctlOptions& o, SchedulerClient& c, const std::string& job_id,
            std::ostream& out, std::ostream& err);

}  // namespace pscluster::psctl

#endif  // PSCLUSTER_SCHEDULER_PSCTL_LOGS_COMMAND_H_
