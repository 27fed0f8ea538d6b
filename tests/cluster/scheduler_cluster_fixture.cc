#include "tests/cluster/scheduler_cluster_fixture.h"

#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/atomic_file.h"

namespace pscluster::testing {

std::string Runfile(const std::string& rel) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir ? srcdir : ".", "/pscluster/", rel);
}

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name);
  std::string cmd = absl::StrCat("rm -rf '", dir, "'");
  (void)!system(cmd.c_str());
  (void)MakeDirs(dir);
  return dir;
}

CommandResult RunCommand(const std::string& binary, const std::vector<std::string>& args,
                         absl::Duration timeout) {
  static int counter = 0;
  std::string out_file = absl::StrCat(std::getenv("TEST_TMPDIR"), "/cmd-", getpid(), "-",
                                      ++counter, ".out");
  CommandResult r;
  psctl::SpawnOptions o;
  o.binary = binary;
  o.args = args;
  o.log_file = out_file;
  auto proc = psctl::Subprocess::Spawn(o);
  if (!proc.ok()) {
    r.output = std::string(proc.status().message());
    return r;
  }
  absl::Time end = absl::Now() + timeout;
  while (!(*proc)->Poll().has_value() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(10));
  r.exit_code = (*proc)->Terminate(absl::Seconds(2));
  auto text = ReadFile(out_file);
  r.output = text.ok() ? *text : "";
  return r;
}

absl::StatusOr<std::unique_ptr<SchedulerProcess>> SchedulerProcess::Start(
    const std::string& dir, const std::string& db, const std::string& listen,
    std::vector<std::string> extra_args) {
  static int counter = 0;
  std::unique_ptr<SchedulerProcess> s(new SchedulerProcess());
  std::string port_file = absl::StrCat(dir, "/scheduler-", ++counter, ".port");
  s->log_ = absl::StrCat(dir, "/scheduler-", counter, ".log");
  psctl::SpawnOptions o;
  o.binary = Runfile("scheduler/ps_scheduler");
  o.args = {absl::StrCat("--listen=", listen), absl::StrCat("--port_file=", port_file),
            absl::StrCat("--db=", db), "--db_sync=normal"};
  o.args.insert(o.args.end(), extra_args.begin(), extra_args.end());
  o.log_file = s->log_;
  auto proc = psctl::Subprocess::Spawn(o);
  if (!proc.ok()) return proc.status();
  s->proc_ = std::move(*proc);
  absl::Time end = absl::Now() + absl::Seconds(20);
  while (absl::Now() < end) {
    if (s->proc_->Poll().has_value()) {
      return absl::UnavailableError(absl::StrCat("ps_scheduler exited: ", s->log()));
    }
    auto text = ReadFile(port_file);
    if (text.ok() && !absl::StripAsciiWhitespace(*text).empty()) {
      s->address_ = std::string(absl::StripAsciiWhitespace(*text));
      return s;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("ps_scheduler did not start: ", s->log()));
}

int SchedulerProcess::port() const {
  int port = 0;
  (void)absl::SimpleAtoi(address_.substr(address_.rfind(':') + 1), &port);
  return port;
}

void SchedulerProcess::Kill() {
  kill(proc_->pid(), SIGKILL);
  proc_->Terminate(absl::ZeroDuration());
}

std::string SchedulerProcess::log() const {
  auto text = ReadFile(log_);
  return text.ok() ? *text : "";
}

SchedulerProcess::~SchedulerProcess() {
  if (proc_) proc_->Terminate(absl::Seconds(5));
}

bool ProcessExists(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t paren = stat.rfind(')');
  return paren == std::string::npos || stat.size() < paren + 3 || stat[paren + 2] != 'Z';
}

}  // namespace pscluster::testing
