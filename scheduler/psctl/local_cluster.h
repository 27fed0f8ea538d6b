// A whole pscluster on this machine as child processes on loopback: one ps_scheduler, N ps_server
// and M ps_worker. Each binds port 0 and reports its address through --port_file; the launcher
// waits for each to answer health checks with SERVING, then for the scheduler to list every
// server and worker as alive. Stop() ends them in order (workers, servers, scheduler) with
// SIGTERM, then SIGKILL after a grace period, so that no process is left behind.
//
// Not thread-safe; owned by the command that started it.
#ifndef PSCLUSTER_SCHEDULER_PSCTL_LOCAL_CLUSTER_H_
#define PSCLUSTER_SCHEDULER_PSCTL_LOCAL_CLUSTER_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "scheduler/psctl/subprocess.h"

namespace pscluster::psctl {

struct LocalClusterOptions {
  std::string scheduler_bin;
  std::string server_bin;
  std::string worker_bin;
  int num_servers = 2;
  int num_workers = 2;
  std::string work_dir;  // Logs, port files, database, checkpoints.
  std::string log_level = "info";
  std::string device = "cpu";  // Passed to the workers.
  absl::Duration startup_timeout = absl::Seconds(60);
  absl::Duration stop_grace = absl::Seconds(5);
  bool detach = false;  // Children survive psctl (stopped later with `psctl down`).
  std::vector<std::string> scheduler_args;  // Extra flags for the scheduler.
  std::vector<std::string> server_args;  // Extra flags for every server.
  std::vector<std::string> worker_args;  // Extra flags for every worker.
  // Bearer token (role viewer or admin) sent while waiting for the nodes, when the scheduler is
  // given a --token_file in scheduler_args.
  std::string token;
  // psctl's token file for this cluster (empty: none), recorded in the state file so that later
  // psctl commands against it find it (StateFileCredentials in up_command.h).
  std::string credential_file;
  // psctl's certificate, key and the cluster's CA when the daemons serve TLS (given the
  // --tls_* flags in their args): used for the health checks and the wait for the nodes, and
  // recorded in the state file like credential_file.
  TlsFiles tls;
  // Returns true when the start should be abandoned (Ctrl-C).
  std::function<bool()> interrupted = [] { return false; };
};

class LocalCluster {
 public:
  // Checks every binary first (NOT_FOUND names the missing one and the flag that sets it), then
  // starts and waits for each process. On any failure everything started so far is stopped, and
  // the error names the process, its log file and the log's last lines.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options,
                                                             std::ostream& progress);
  ~LocalCluster();

  const std::string& scheduler_address() const { return scheduler_address_; }
  // The processes, "name pid binary", one per line.
  std::vector<std::string> Describe() const;
  // OK while every child runs; otherwise names the first that exited, with its log's tail.
  absl::Status CheckAlive();
  // Stops every child (workers, servers, then the scheduler); returns how many were running.
  int Stop();
  // Writes what `psctl down` needs to stop a detached cluster.
  absl::Status WriteStateFile(const std::string& path) const;
  // Leaves the children running when this object goes away (detached clusters).
  void Release();

  // The processes by name: "scheduler", "server-1" ... "server-N", "worker-1" ... "worker-M".
  std::vector<std::string> Names() const;
  // A process's pid (-1 for an unknown name), address (host:port) and log file ("" if unknown).
  pid_t Pid(const std::string& name) const;
  std::string Address(const std::string& name) const;
  std::string LogFile(const std::string& name) const;
  // Sends `signal` to a process; with SIGKILL, also waits until it is gone. NOT_FOUND for an
  // unknown name.
  absl::Status Signal(const std::string& name, int signal);
  // Starts a process that has ended (killed, crashed) again with its original flags, listening
  // on the address it had, so that the daemons that know it reconnect. FAILED_PRECONDITION while
  // it still runs.
  absl::Status Restart(const std::string& name, std::ostream& progress);

  // Stops the processes a state file lists (checking each pid still runs its binary), then
  // removes the file. NOT_FOUND when there is no state file.
  static absl::StatusOr<int> StopFromStateFile(const std::string& path, absl::Duration grace,
                                               std::ostream& progress);

 private:
  struct Child {
    std::string name;
    std::string binary;
    std::vector<std::string> args;  // As first given (--port_file excluded).
    std::string log;
    std::string address;
    std::unique_ptr<Subprocess> proc;
  };
  explicit LocalCluster(const LocalClusterOptions& options) : options_(options) {}
  absl::Status Launch(const std::string& name, const std::string& binary,
                      std::vector<std::string> args, std::ostream& progress);
  // Spawns `c` (its name, binary and args set) and waits until it listens and serves.
  absl::Status Spawn(Child& c, std::vector<std::string> args, std::ostream& progress);
  Child* Find(const std::string& name);
  const Child* Find(const std::string& name) const;
  absl::Status WaitForNodes();
  std::string Tail(const Child& c) const;

  const LocalClusterOptions options_;
  std::vector<Child> children_;
  std::string scheduler_address_;
  bool released_ = false;
};

// The last `lines` lines of a file ("" if unreadable).
std::string TailOfFile(const std::string& path, int lines);

}  // namespace pscluster::psctl

#endif  // PSCLUSTER_SCHEDULER_PSCTL_LOCAL_CLUSTER_H_
