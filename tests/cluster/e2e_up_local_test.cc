// End to end with the real daemons: `psctl up --local` starts ps_scheduler, 2 ps_server and
// 2 ps_worker, trains a short job given with --job= to the end with live progress, prints the
// final test accuracy and where the model was exported, and leaves no process behind.
#include <signal.h>

#include <fstream>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/e2e_cluster.h"

namespace pscluster::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

// The pids psctl reported as "started NAME (pid N)".
std::vector<pid_t> StartedPids(const std::string& output) {
  std::vector<pid_t> pids;
  std::regex re("started [a-z0-9-]+ \\(pid ([0-9]+)\\)");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  return pids;
}

TEST(E2eUpLocalTest, RunsAShortJobToTheEndWithTheRealDaemonsAndLeavesNoProcess) {
  std::string dir = TestDir("up_local");
  std::string job = dir + "/short.yaml";
  {
    std::ofstream f(job);
    // The export path is replaced by one in the work directory.
    f << FashionJobYaml("up-short", 1, "/nonexistent/ignored.safetensors");
  }
  const std::string work = dir + "/work";
  CommandResult r = RunCommand(PsctlBinary(),
                               {"up", "--local", "--interval=200ms", "--work_dir=" + work,
                                "--job=" + job, "--scheduler_bin=" + SchedulerBinary(),
                                "--server_bin=" + ServerBinary(),
                                "--worker_bin=" + WorkerBinary(), "--worker_args=--cpu_threads=1"},
                               absl::Seconds(85));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("local cluster ready"));
  // Secured by default (e2e_up_secured_test checks what that means): the job ran to its end
  // with every call authenticated, in mutual TLS.
  EXPECT_THAT(r.output, HasSubstr("secured: every daemon serves mutual TLS"));
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("submitted job-1 (up-short) from ", job)));
  EXPECT_THAT(r.output, HasSubstr("job-1 running"));  // Live progress.
  EXPECT_THAT(r.output, HasSubstr("done: stopped 5 processes"));

  // The final line: accuracy and export path.
  const std::string model = work + "/models/up-short.safetensors";
  std::smatch m;
  std::regex final_line("job-1 succeeded in [^:]+: test accuracy ([0-9.]+), model exported to "
                        "([^\\n]+)");
  ASSERT_TRUE(std::regex_search(r.output, m, final_line)) << r.output;
  double accuracy = 0;
  ASSERT_TRUE(absl::SimpleAtod(m[1].str(), &accuracy)) << m[1];
  EXPECT_GE(accuracy, 0.80);
  EXPECT_LE(accuracy, 1.0);
  EXPECT_EQ(m[2].str(), model);
  auto file = SafetensorsFile::Read(model);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(file->entries(), SizeIs(4));
  ASSERT_NE(file->Find("fc1/weight"), nullptr);
  EXPECT_EQ(file->Find("fc1/weight")->shape, (std::vector<uint64_t>{784, 64}));

  // The real binaries ran, and every one of them is gone.
  std::vector<pid_t> pids = StartedPids(r.output);
  ASSERT_THAT(pids, SizeIs(5)) << r.output;
  for (pid_t p : pids) EXPECT_FALSE(ProcessExists(p)) << "pid " << p << " is still running";
  for (const char* name : {"server-1", "server-2"}) {
    EXPECT_THAT(ReadFile(absl::StrCat(work, "/logs/", name, ".log")).value_or(""),
                HasSubstr("ps_server serving on")) << name;
  }
  for (const char* name : {"worker-1", "worker-2"}) {
    std::string log = ReadFile(absl::StrCat(work, "/logs/", name, ".log")).value_or("");
    EXPECT_THAT(log, HasSubstr("ps_worker serving on")) << name;
    EXPECT_THAT(log, HasSubstr("task done: job job-1")) << name;
    EXPECT_THAT(log, HasSubstr("callers authenticated (bearer tokens and client certificates)"))
        << name;
    EXPECT_THAT(log, HasSubstr("(requested 127.0.0.1:0, TLS)")) << name;
  }
}

}  // namespace
}  // namespace pscluster::testing
