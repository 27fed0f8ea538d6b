// Child processes for the local cluster: started with their output in a log file, in their own
// process group (a terminal's Ctrl-C reaches psctl only, which then stops them in order), and by
// default bound to psctl's life (they get SIGTERM if psctl dies, even by SIGKILL).
#ifndef PSCLUSTER_SCHEDULER_PSCTL_SUBPROCESS_H_
#define PSCLUSTER_SCHEDULER_PSCTL_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pscluster::psctl {

struct SpawnOptions {
  std::string binary;              // Path of the executable.
  std::vector<std::string> args;   // Arguments after argv[0].
  std::string log_file;            // stdout and stderr are appended here ("" = /dev/null).
  bool die_with_parent = true;     // SIGTERM when the spawning process dies.
  bool new_session = false;        // setsid(): survives the terminal (detached clusters).
};

class Subprocess {
 public:
  // NOT_FOUND names a binary that does not exist or cannot be executed.
  // REQUIRES: called from the thread that lives as long as the child should (the parent-death
  // signal follows the spawning thread).
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(const SpawnOptions& options);
  // Terminates the child unless Release() was called.
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // The exit code if the child has ended (128 + signal when killed by one), else nullopt.
  std::optional<int> Poll();
  // SIGTERM, then SIGKILL after `grace`; waits for it and returns its exit code.
  int Terminate(absl::Duration grace);
  // Leaves the child running when this object goes away.
  void Release() { released_ = true; }

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  std::optional<int> exit_code_;
  bool released_ = false;
};

// Waits for a process that is not our child (a detached cluster) to exit: SIGTERM, then SIGKILL
// after `grace`. Returns false if it was still there after the SIGKILL.
bool TerminatePid(pid_t pid, absl::Duration grace);

// Whether `pid` runs the executable at `binary` (guards against a recycled pid).
bool PidRuns(pid_t pid, const std::string& binary);

}  // namespace pscluster::psctl

#endif  // PSCLUSTER_SCHEDULER_PSCTL_SUBPROCESS_H_
