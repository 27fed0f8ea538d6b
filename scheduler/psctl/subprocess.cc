#include "scheduler/psctl/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pscluster::psctl {
namespace {

int Decode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::string RealPath(const std::string& p) {
  char buf[PATH_MAX];
  if (realpath(p.c_str(), buf) == nullptr) return p;
  return buf;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(const SpawnOptions& o) {
  if (access(o.binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(o.binary, ": ",
                                            static_cast<const char*>(strerror(errno))));
  }
  // Everything the child needs is prepared before fork(): after it, only async-signal-safe calls.
  std::vector<std::string> argv_s = {o.binary};
  argv_s.insert(argv_s.end(), o.args.begin(), o.args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const char* log = o.log_file.empty() ? "/dev/null" : o.log_file.c_str();
  int log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open log file ", log, ": ", static_cast<const char*>(strerror(errno))));
  }
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(log_fd);
    close(null_fd);
    return absl::InternalError(absl::StrCat("pipe: ", static_cast<const char*>(strerror(errno))));
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(log_fd);
    close(null_fd);
    close(err_pipe[0]);
    close(err_pipe[1]);
    return absl::ResourceExhaustedError(
        absl::StrCat("fork for ", o.binary, ": ", static_cast<const char*>(strerror(e))));
  }
  if (pid == 0) {
    if (o.new_session) {
      setsid();
    } else {
      setpgid(0, 0);
    }
    if (o.die_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);  // The parent died before prctl().
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    dup2(null_fd, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    execv(argv[0], argv.data());
    int e = errno;
    (void)!write(err_pipe[1], &e, sizeof(e));
    _exit(127);
  }
  close(log_fd);
  close(null_fd);
  close(err_pipe[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(err_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(err_pipe[0]);
  if (n == sizeof(child_errno)) {
    int status;
    waitpid(pid, &status, 0);
    return absl::NotFoundError(absl::StrCat("cannot run ", o.binary, ": ",
                                            static_cast<const char*>(strerror(child_errno))));
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid));
}

Subprocess::~Subprocess() {
  if (!released_) Terminate(absl::Seconds(5));
}

std::optional<int> Subprocess::Poll() {
  if (exit_code_.has_value()) return exit_code_;
  int status;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) exit_code_ = Decode(status);
  return exit_code_;
}

int Subprocess::Terminate(absl::Duration grace) {
  if (Poll().has_value()) return *exit_code_;
  kill(pid_, SIGTERM);
  absl::Time end = absl::Now() + grace;
  while (absl::Now() < end) {
    if (Poll().has_value()) return *exit_code_;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid_, SIGKILL);
  int status;
  if (waitpid(pid_, &status, 0) == pid_) exit_code_ = Decode(status);
  return exit_code_.value_or(-1);
}

bool TerminatePid(pid_t pid, absl::Duration grace) {
  auto gone = [pid] {
    if (kill(pid, 0) != 0) return errno == ESRCH;
    // A zombie waiting for its reaper counts as gone.
    std::string stat_path = absl::StrCat("/proc/", pid, "/stat");
    int fd = open(stat_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return true;
    char buf[512];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) return true;
    buf[n] = 0;
    const char* close_paren = strrchr(buf, ')');
    return close_paren != nullptr && close_paren[1] == ' ' && close_paren[2] == 'Z';
  };
  if (gone()) return true;
  kill(pid, SIGTERM);
  absl::Time end = absl::Now() + grace;
  while (absl::Now() < end) {
    if (gone()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(pid, SIGKILL);
  for (int i = 0; i < 100 && !gone(); ++i) absl::SleepFor(absl::Milliseconds(20));
  return gone();
}

bool PidRuns(pid_t pid, const std::string& binary) {
  char buf[PATH_MAX];
  std::string link = absl::StrCat("/proc/", pid, "/exe");
  ssize_t n = readlink(link.c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return false;
  buf[n] = 0;
  return std::string(buf) == RealPath(binary);
}

}  // namespace pscluster::psctl
