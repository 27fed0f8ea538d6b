// Cluster tier: `psctl up --local` launching real processes: the ps_scheduler binary, and
// stand-in server and worker binaries in place of ps_server / ps_worker (they speak the same
// protocol and simulate a training run). Checks the launcher's mechanics: start, port files,
// health, live progress, final accuracy and export path, clean shutdown on completion, Ctrl-C,
// psctl's own death, --detach / down, and clear errors for missing binaries.
#include <signal.h>

#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/psctl/subprocess.h"
#include "tests/cluster/scheduler_cluster_fixture.h"

namespace pscluster::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// --insecure: the stand-ins take no --token_file and send no credential (the secured default is
// covered with the real daemons by e2e_up_secured_test).
std::vector<std::string> UpArgs(const std::string& work_dir, const std::string& worker_args) {
  return {"up",
          "--local",
          "--insecure",
          "--interval=100ms",
          "--work_dir=" + work_dir,
          "--scheduler_bin=" + Runfile("scheduler/ps_scheduler"),
          "--server_bin=" + Runfile("scheduler/standin_server"),
          "--worker_bin=" + Runfile("scheduler/standin_worker"),
          "--worker_args=" + worker_args};
}

// The pids psctl reported as "started NAME (pid N)".
std::vector<pid_t> StartedPids(const std::string& output) {
  std::vector<pid_t> pids;
  std::regex re("started [a-z0-9-]+ \\(pid ([0-9]+)\\)");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  return pids;
}

bool AllGone(const std::vector<pid_t>& pids, absl::Duration timeout) {
  absl::Time end = absl::Now() + timeout;
  while (true) {
    bool any = false;
    for (pid_t p : pids) any = any || ProcessExists(p);
    if (!any) return true;
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// psctl running in the background with its output in a file.
struct Background {
  std::unique_ptr<psctl::Subprocess> proc;
  std::string out_file;
  std::string Output() const {
    auto t = ReadFile(out_file);
    return t.ok() ? *t : "";
  }
  bool WaitForOutput(const std::string& text, absl::Duration timeout) const {
    absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (Output().find(text) != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }
};

Background StartPsctl(const std::vector<std::string>& args, const std::string& dir) {
  Background b;
  b.out_file = dir + "/psctl.out";
  psctl::SpawnOptions o;
  o.binary = Runfile("scheduler/psctl");
  o.args = args;
  o.log_file = b.out_file;
  auto p = psctl::Subprocess::Spawn(o);
  EXPECT_TRUE(p.ok()) << p.status();
  if (p.ok()) b.proc = std::move(*p);
  return b;
}

TEST(PsctlUpLocalTest, RunsTheExampleJobToTheEndAndLeavesNoProcess) {
  std::string dir = TestDir("up_full");
  CommandResult r = RunCommand(Runfile("scheduler/psctl"),
                               UpArgs(dir + "/work", "--standin_steps=24 --standin_step_ms=15 "
                                                     "--standin_test_accuracy=0.8871"),
                               absl::Seconds(90));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The default job is the shipped example, found next to psctl.
  EXPECT_THAT(r.output, HasSubstr("deploy/examples/fashion_mlp.yaml"));
  EXPECT_THAT(r.output, HasSubstr("local cluster ready"));
  EXPECT_THAT(r.output, HasSubstr("job-1 running ["));
  EXPECT_THAT(r.output, HasSubstr("job-1 succeeded"));
  EXPECT_THAT(r.output, HasSubstr("test accuracy 0.8871"));
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("model exported to ", dir,
                                               "/work/models/fashion-mlp.safetensors")));
  EXPECT_THAT(r.output, HasSubstr("done: stopped 5 processes"));
  std::vector<pid_t> pids = StartedPids(r.output);
  ASSERT_EQ(pids.size(), 5u) << r.output;
  EXPECT_TRUE(AllGone(pids, absl::Seconds(5)));
  // Each daemon wrote its port file and log in the work directory.
  for (const char* name : {"scheduler", "server-1", "server-2", "worker-1", "worker-2"}) {
    EXPECT_TRUE(ReadFile(absl::StrCat(dir, "/work/ports/", name, ".port")).ok()) << name;
    EXPECT_TRUE(ReadFile(absl::StrCat(dir, "/work/logs/", name, ".log")).ok()) << name;
  }
}

TEST(PsctlUpLocalTest, CtrlCCancelsTheJobAndStopsEveryChild) {
  std::string dir = TestDir("up_ctrl_c");
  Background b = StartPsctl(UpArgs(dir + "/work", "--standin_steps=1000000"), dir);
  ASSERT_NE(b.proc, nullptr);
  ASSERT_TRUE(b.WaitForOutput("job-1 running [", absl::Seconds(60))) << b.Output();
  std::vector<pid_t> pids = StartedPids(b.Output());
  ASSERT_EQ(pids.size(), 5u);
  kill(b.proc->pid(), SIGINT);
  absl::Time end = absl::Now() + absl::Seconds(30);
  while (!b.proc->Poll().has_value() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(b.proc->Poll().has_value()) << "psctl did not stop on SIGINT: " << b.Output();
  EXPECT_EQ(*b.proc->Poll(), 130);
  EXPECT_THAT(b.Output(), HasSubstr("interrupted: cancelling job-1"));
  EXPECT_THAT(b.Output(), HasSubstr("stopped 5 processes"));
  EXPECT_TRUE(AllGone(pids, absl::Seconds(5)));
}

TEST(PsctlUpLocalTest, KillingPsctlTakesItsChildrenWithIt) {
  std::string dir = TestDir("up_kill");
  Background b = StartPsctl(UpArgs(dir + "/work", "--standin_steps=1000000"), dir);
  ASSERT_NE(b.proc, nullptr);
  ASSERT_TRUE(b.WaitForOutput("job-1 running [", absl::Seconds(60))) << b.Output();
  std::vector<pid_t> pids = StartedPids(b.Output());
  ASSERT_EQ(pids.size(), 5u);
  kill(b.proc->pid(), SIGKILL);
  EXPECT_EQ(b.proc->Terminate(absl::Seconds(1)), 128 + SIGKILL);
  EXPECT_TRUE(AllGone(pids, absl::Seconds(15)));
}

TEST(PsctlUpLocalTest, DetachThenDown) {
  std::string dir = TestDir("up_detach");
  std::vector<std::string> args = UpArgs(dir + "/work", "");
  args.push_back("--detach");
  args.push_back("--job=none");
  CommandResult up = RunCommand(Runfile("scheduler/psctl"), args, absl::Seconds(60));
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_THAT(up.output, HasSubstr("export PSCLUSTER_SCHEDULER=127.0.0.1:"));
  std::vector<pid_t> pids = StartedPids(up.output);
  ASSERT_EQ(pids.size(), 5u);
  for (pid_t p : pids) EXPECT_TRUE(ProcessExists(p)) << p;

  // A second `up` on the same work directory is refused while the first runs.
  CommandResult again = RunCommand(Runfile("scheduler/psctl"), args, absl::Seconds(30));
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_THAT(again.output, HasSubstr("still running"));

  CommandResult down = RunCommand(Runfile("scheduler/psctl"),
                                  {"down", "--work_dir=" + dir + "/work"}, absl::Seconds(60));
  ASSERT_EQ(down.exit_code, 0) << down.output;
  EXPECT_THAT(down.output, HasSubstr("local cluster stopped (5 processes)"));
  EXPECT_TRUE(AllGone(pids, absl::Seconds(5)));
  down = RunCommand(Runfile("scheduler/psctl"), {"down", "--work_dir=" + dir + "/work"});
  EXPECT_EQ(down.exit_code, 0);
  EXPECT_THAT(down.output, HasSubstr("no local cluster is running"));
}

TEST(PsctlUpLocalTest, MissingBinariesAreNamedAndNothingStarts) {
  std::string dir = TestDir("up_missing");
  std::vector<std::string> args = UpArgs(dir + "/work", "");
  args[6] = "--server_bin=/nonexistent/ps_server";
  CommandResult r = RunCommand(Runfile("scheduler/psctl"), args);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--server_bin: the ps_server binary '/nonexistent/ps_server' "
                                  "does not exist"));
  EXPECT_THAT(r.output, Not(HasSubstr("started")));

  // Without the flag, the default places are searched and listed. psctl runs from a copy of
  // its own, so that a ps_worker built next to it in Bazel's output tree is not found.
  const std::string lone = dir + "/bin/psctl";
  ASSERT_TRUE(MakeDirs(dir + "/bin").ok());
  ASSERT_EQ(RunCommand("/bin/cp", {Runfile("scheduler/psctl"), lone}).exit_code, 0);
  r = RunCommand(lone,
                 {"up", "--local", "--work_dir=" + dir + "/work",
                  "--scheduler_bin=" + Runfile("scheduler/ps_scheduler"),
                  "--server_bin=" + Runfile("scheduler/standin_server")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("cannot find the ps_worker binary (looked at "));
  EXPECT_THAT(r.output, HasSubstr("bazel build //worker:ps_worker"));
  EXPECT_THAT(r.output, Not(HasSubstr("started")));
}

TEST(PsctlUpLocalTest, ADaemonThatCannotStartIsReportedWithItsLog) {
  std::string dir = TestDir("up_bad_daemon");
  std::vector<std::string> args = UpArgs(dir + "/work", "--no_such_flag=1");
  CommandResult r = RunCommand(Runfile("scheduler/psctl"), args, absl::Seconds(60));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("worker-1 ("));
  EXPECT_THAT(r.output, HasSubstr("exited with code 1 before listening"));
  EXPECT_THAT(r.output, HasSubstr("no_such_flag"));  // From the daemon's own log.
  std::vector<pid_t> pids = StartedPids(r.output);
  EXPECT_EQ(pids.size(), 3u);  // Scheduler and servers started, then were stopped.
  EXPECT_TRUE(AllGone(pids, absl::Seconds(5)));
}

}  // namespace
}  // namespace pscluster::testing
