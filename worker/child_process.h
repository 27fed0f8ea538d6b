// A child process of the worker that runs a user's command (an entrypoint task): argv looked up
// in PATH, its own environment and working directory, stdout and stderr as pipes the caller
// reads, one more pipe's write end inherited as fd 3, in a process group of its own (so that
// the whole group can be signalled), and killed (SIGKILL) if the thread that spawned it dies
// with the worker (PR_SET_PDEATHSIG).
//
// Thread model: one thread spawns, polls, signals and waits.
#ifndef PSCLUSTER_WORKER_CHILD_PROCESS_H_
#define PSCLUSTER_WORKER_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pscluster::worker {

struct ChildOptions {
  std::vector<std::string> argv;  // argv[0]: a path, or a name looked up in the env's PATH.
  std::vector<std::string> env;   // The child's whole environment, "NAME=value" each.
  std::string working_dir;        // "" = the caller's.
  int fd3 = -1;                   // Inherited by the child as fd 3 (-1 = none).
};

// How a child ended.
struct ChildExit {
  bool signaled = false;
  int code = 0;  // The exit status, or the signal's number when `signaled`.
  std::string ToString() const;  // "exit status 3" or "signal 9 (Killed)".
};

class ChildProcess {
 public:
  // NOT_FOUND when argv[0] is no executable on PATH; FAILED_PRECONDITION when the working
  // directory cannot be entered or exec fails (errno named). REQUIRES: !argv.empty(); called on
  // the thread that waits for the child (the parent-death signal follows that thread).
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const ChildOptions& options);
  // Kills the process group (SIGKILL) and reaps the child if it still runs.
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  // Read ends of the child's stdout and stderr (non-blocking, close-on-exec); owned here.
  int stdout_fd() const { return out_fd_; }
  int stderr_fd() const { return err_fd_; }
  // How the child ended, once it has (reaps it); nullopt while it runs.
  std::optional<ChildExit> Poll();
  // Sends `sig` to the child's whole process group (what is left of it once the child ended).
  void Signal(int sig);

 private:
  ChildProcess(pid_t pid, int out_fd, int err_fd) : pid_(pid), out_fd_(out_fd), err_fd_(err_fd) {}
  const pid_t pid_;
  const int out_fd_, err_fd_;
  std::optional<ChildExit> exit_;
};

// Where `name` resolves among the directories of `path` (a PATH value): the first executable
// regular file; a name with a '/' is returned as given.
std::optional<std::string> FindExecutable(const std::string& name, const std::string& path);

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_CHILD_PROCESS_H_
