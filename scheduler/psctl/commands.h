// psctl's subcommands, run in-process on typed options (flags are parsed in psctl_main.cc only):
//
//   submit FILE.yaml [--wait]   queue a job; prints its id (with --wait: follows it, exit 0 on
//                               success, 1 on failure or cancellation)
//   jobs [--active]             every job, newest first
//   status [JOB] [--watch]      one job in full (live with --watch), or the cluster overview;
//                               --history: the job's progress over time and its events
//   cancel JOB [--reason=...]   stop a job
//   nodes                       servers and workers with liveness and load
//   shards JOB                  a job's shard map and per-shard load
//   move-shard JOB SHARD SERVER [FROM]  move a virtual shard (or FROM's backup of it) live
//   checkpoint JOB [DIR]        checkpoint a running job now
//   export JOB [--to PATH]      export a running job's model now (safetensors)
//   logs JOB [--rank N] [--follow]  an entrypoint job's output (logs_command.h)
//   up --local                  a scheduler, 2 servers and 2 workers as child processes; runs
//                               deploy/examples/fashion_mlp.yaml to the end, then stops them
//   down                        stops a cluster started with `up --local --detach`
#ifndef PSCLUSTER_SCHEDULER_PSCTL_COMMANDS_H_
#define PSCLUSTER_SCHEDULER_PSCTL_COMMANDS_H_

#include <atomic>
#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "scheduler/psctl/client.h"
#include "scheduler/psctl/format.h"

namespace pscluster::psctl {

// Set by psctl's signal thread on SIGINT/SIGTERM. Commands that wait for long poll it and end
// cleanly; `handled` tells the signal thread that such a command is running (otherwise psctl
// exits at once with 130).
struct Interrupt {
  std::atomic<bool> requested{false};
  std::atomic<bool> handled{false};
};

struct UpOptions {
  bool local = false;               // --local (the only mode so far).
  bool detach = false;              // Leave the cluster running; `psctl down` stops it.
  // Without tokens: every daemon accepts every call (up --local --insecure). By default the
  // cluster is secured with fresh tokens (local_credentials.h).
  bool insecure = false;
  std::string scheduler_bin;        // Default: next to psctl / in its runfiles.
  std::string server_bin;           // Default: server/ps_server in the output tree / runfiles.
  std::string worker_bin;           // Default: worker/ps_worker in the output tree / runfiles.
  std::string job_file;             // Default: deploy/examples/fashion_mlp.yaml; "none" = no job.
  std::string work_dir;             // Default: $TMPDIR/pscluster-local-$UID.
  int servers = 2;
  int workers = 2;
  std::string device = "cpu";
  std::string log_level = "info";
  absl::Duration startup_timeout = absl::Seconds(60);
  std::vector<std::string> server_args;  // Extra flags for each server.
  std::vector<std::string> worker_args;  // Extra flags for each worker.
};

struct PsctlOptions {
  ClientOptions client;
  OutputFormat output = OutputFormat::kTable;
  bool wait = false;         // submit --wait
  bool watch = false;        // status --watch
  bool history = false;      // status JOB --history
  bool active_only = false;  // jobs --active
  std::string reason;        // cancel --reason
  std::string export_to;     // export --to
  int logs_rank = -1;        // logs --rank (-1 = every rank)
  bool follow = false;       // logs --follow
  int32_t scale_servers = -1;  // scale --servers (-1: not given)
  absl::Duration interval = absl::Seconds(1);  // Refresh period of live views.
  bool tty = false;          // Redraw live views in place (stdout is a terminal).
  std::string self_path;     // This executable (finds sibling binaries and example jobs).
  UpOptions up;
  Interrupt* interrupt = nullptr;  // May be null (no signal handling).
};

// Runs one command; `args` are the positional arguments (command first). Returns the exit code:
// 0 success, 1 failure (the message is on `err`), 2 usage error, 130 interrupted.
// The usage text (every command), for usage errors and --help.
const char* UsageText();

int RunPsctl(const PsctlOptions& options, const std::vector<std::string>& args, std::ostream& out,
             std::ostream& err);

// Where `up --local` looks for a binary or data file, first match wins.
std::vector<std::string> CandidatePaths(const std::string& self_path, const std::string& package,
                                        const std::string& name);

}  // namespace pscluster::psctl

#endif  // PSCLUSTER_SCHEDULER_PSCTL_COMMANDS_H_
