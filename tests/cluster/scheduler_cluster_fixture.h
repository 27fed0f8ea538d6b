// Cluster-tier support for the scheduler and psctl: the real binaries (Bazel data deps) started
// as processes on loopback ports chosen by the OS, and psctl runs with their output captured.
#ifndef PSCLUSTER_TESTS_CLUSTER_SCHEDULER_CLUSTER_FIXTURE_H_
#define PSCLUSTER_TESTS_CLUSTER_SCHEDULER_CLUSTER_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scheduler/psctl/subprocess.h"

namespace pscluster::testing {

// $TEST_SRCDIR/pscluster/<rel>.
std::string Runfile(const std::string& rel);
// A fresh directory under $TEST_TMPDIR.
std::string TestDir(const std::string& name);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together.
};

// Runs `binary args...` to completion (killed after `timeout`).
CommandResult RunCommand(const std::string& binary, const std::vector<std::string>& args,
                         absl::Duration timeout = absl::Seconds(30));

// A ps_scheduler process.
class SchedulerProcess {
 public:
  // Starts the binary on `listen` (port 0 = any) with its database at `db`, and waits until it
  // has written its port file.
  static absl::StatusOr<std::unique_ptr<SchedulerProcess>> Start(
      const std::string& dir, const std::string& db, const std::string& listen = "127.0.0.1:0",
      std::vector<std::string> extra_args = {});
  const std::string& address() const { return address_; }
  int port() const;
  pid_t pid() const { return proc_->pid(); }
  // kill -9, reaped.
  void Kill();
  std::string log() const;
  ~SchedulerProcess();

 private:
  std::unique_ptr<psctl::Subprocess> proc_;
  std::string address_;
  std::string log_;
};

// Whether process `pid` still exists (zombies count as gone).
bool ProcessExists(pid_t pid);

}  // namespace pscluster::testing

#endif  // PSCLUSTER_TESTS_CLUSTER_SCHEDULER_CLUSTER_FIXTURE_H_
