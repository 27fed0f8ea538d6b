#include "worker/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pscluster::worker {
namespace {

std::string Errno(int e) { return strerror(e); }

// What the child reports through its error pipe when it cannot exec.
struct SpawnError {
  int stage = 0;  // 1: chdir, 2: exec.
  int err = 0;
};

}  // namespace

std::string ChildExit::ToString() const {
  if (!signaled) return absl::StrCat("exit status ", code);
  return absl::StrCat("signal ", code, " (", strsignal(code), ")");
}

std::optional<std::string> FindExecutable(const std::string& name, const std::string& path) {
  if (name.find('/') != std::string::npos) return name;
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const ChildOptions& o) {
  std::string path_var = "/usr/local/bin:/usr/bin:/bin";
  for (const std::string& e : o.env) {
    if (e.rfind("PATH=", 0) == 0) path_var = e.substr(5);
  }
  std::optional<std::string> binary = FindExecutable(o.argv[0], path_var);
  if (!binary.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("entrypoint.command[0]: '", o.argv[0], "' is not an executable on PATH (",
                     path_var, ")"));
  }
  // Everything the child needs is prepared before fork(): after it, only async-signal-safe calls.
  std::vector<std::string> argv_s = o.argv;
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s = o.env;
  std::vector<char*> envp;
  for (std::string& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  const char* exe = binary->c_str();
  const char* dir = o.working_dir.empty() ? nullptr : o.working_dir.c_str();

  int out[2], err[2], report[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe: " + Errno(errno));
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError("pipe: " + Errno(errno));
  }
  if (pipe2(report, O_CLOEXEC) != 0) {
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    return absl::InternalError("pipe: " + Errno(errno));
  }
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1], report[0], report[1], null_fd}) close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("fork for ", o.argv[0], ": ", Errno(e)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // The worker died before prctl().
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) signal(s, SIG_DFL);
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    if (o.fd3 >= 0) {
      if (o.fd3 == 3) {
        fcntl(3, F_SETFD, 0);
      } else {
        dup2(o.fd3, 3);
      }
    }
    SpawnError se;
    if (dir != nullptr && chdir(dir) != 0) {
      se = {1, errno};
    } else {
      execve(exe, argv.data(), envp.data());
      se = {2, errno};
    }
    (void)!write(report[1], &se, sizeof(se));
    _exit(127);
  }
  // The parent: its copies of the child's ends go.
  setpgid(pid, pid);  // Also here, so that Signal() finds the group even before the child ran.
  for (int fd : {out[1], err[1], report[1], null_fd}) close(fd);
  SpawnError se;
  ssize_t n;
  do {
    n = read(report[0], &se, sizeof(se));
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n == sizeof(se)) {
    int status;
    waitpid(pid, &status, 0);
    close(out[0]);
    close(err[0]);
    if (se.stage == 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "entrypoint.working_dir: cannot enter ", o.working_dir, ": ", Errno(se.err)));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("entrypoint.command[0]: cannot run ", *binary, ": ", Errno(se.err)));
  }
  for (int fd : {out[0], err[0]}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, out[0], err[0]));
}

ChildProcess::~ChildProcess() {
  if (!exit_.has_value()) {
    Signal(SIGKILL);
    int status;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  } else {
    ::kill(-pid_, SIGKILL);  // What is left of its group (the child itself is reaped).
  }
  close(out_fd_);
  close(err_fd_);
}

std::optional<ChildExit> ChildProcess::Poll() {
  if (exit_.has_value()) return exit_;
  int status;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    ChildExit e;
    if (WIFSIGNALED(status)) {
      e.signaled = true;
      e.code = WTERMSIG(status);
    } else {
      e.code = WEXITSTATUS(status);
    }
    exit_ = e;
  }
  return exit_;
}

void ChildProcess::Signal(int sig) {
  // The group while it exists; the child alone when it left the group (setsid), as long as it
  // is not reaped (its pid cannot have been reused then).
  if (::kill(-pid_, sig) != 0 && !Poll().has_value()) ::kill(pid_, sig);
}

}  // namespace pscluster::worker
