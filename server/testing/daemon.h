// Launches a real daemon binary (a Bazel data dependency) for cluster-tier tests, waits for the
// port file it writes, and stops it with a signal. Waits take a timeout and fail fast when the
// process exits early.
#ifndef PSCLUSTER_SERVER_TESTING_DAEMON_H_
#define PSCLUSTER_SERVER_TESTING_DAEMON_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pscluster {
namespace testing {

inline std::string RunfilePath(const std::string& rel) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return std::string(srcdir ? srcdir : ".") + "/pscluster/" + rel;
}

class Daemon {
 public:
  // Starts `binary` with `args`; stderr goes to `log_path`.
  Daemon(const std::string& binary, const std::vector<std::string>& args,
         const std::string& log_path)
      : log_path_(log_path) {
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // Never outlive the parent.
      int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 2);
        dup2(fd, 1);
      }
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(binary.c_str()));
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
  }
  ~Daemon() {
    if (running()) {
      kill(pid_, SIGKILL);
      Wait(absl::Seconds(10));
    }
  }

  bool running() {
    if (exited_) return false;
    int status;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return false;
    }
    return true;
  }

  // The address in `port_file` once it appears; an error if the daemon exits or time runs out.
  absl::StatusOr<std::string> WaitForPortFile(const std::string& port_file,
                                              absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      std::ifstream f(port_file);
      std::string line;
      if (f && std::getline(f, line) && !line.empty()) return line;
      if (!running()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "daemon exited with ", exit_code_, " before writing ", port_file, "; log:\n", Log()));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError(absl::StrCat("no ", port_file, " after ",
                                                    absl::FormatDuration(timeout), "; log:\n",
                                                    Log()));
  }

  // Exit code (128 + signal if killed), or -1 on timeout.
  int Wait(absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (!running()) return exit_code_;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return -1;
  }
  int Signal(int sig, absl::Duration timeout = absl::Seconds(20)) {
    if (running()) kill(pid_, sig);
    return Wait(timeout);
  }

  pid_t pid() const { return pid_; }

  std::string Log() const {
    std::ifstream f(log_path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  std::string log_path_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_code_ = -1;
};

}  // namespace testing
}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_TESTING_DAEMON_H_
