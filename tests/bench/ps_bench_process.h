// Child processes of the benchmark (ps_server, echo servers), each on port 0 with a port file.
#ifndef PSCLUSTER_TESTS_BENCH_PS_BENCH_PROCESS_H_
#define PSCLUSTER_TESTS_BENCH_PS_BENCH_PROCESS_H_

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pscluster {
namespace bench {

class ChildProcess {
 public:
  ChildProcess(const std::string& binary, std::vector<std::string> args, const std::string& port_file)
      : port_file_(port_file) {
    unlink(port_file.c_str());
    args.push_back("--port_file=" + port_file);
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // Never outlive the parent.
      std::vector<char*> argv = {const_cast<char*>(binary.c_str())};
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st;
      for (int i = 0; i < 300 && waitpid(pid_, &st, WNOHANG) == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
      kill(pid_, SIGKILL);
      waitpid(pid_, &st, 0);
    }
  }
  absl::StatusOr<std::string> Address(absl::Duration timeout = absl::Seconds(20)) {
    absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      std::ifstream f(port_file_);
      std::string line;
      if (f && std::getline(f, line) && !line.empty()) return line;
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::UnavailableError(absl::StrCat("child exited before writing ", port_file_));
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::DeadlineExceededError(absl::StrCat("no ", port_file_));
  }

 private:
  std::string port_file_;
  pid_t pid_ = -1;
};

}  // namespace bench
}  // namespace pscluster

#endif  // PSCLUSTER_TESTS_BENCH_PS_BENCH_PROCESS_H_
