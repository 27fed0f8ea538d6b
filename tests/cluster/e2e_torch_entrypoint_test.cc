// End to end with the real daemons and PyTorch: the example deploy/examples/torch_mlp/train.py
// run by a local cluster (a scheduler, 2 ps_server, 2 ps_worker) as an entrypoint job, each
// rank's python3 a child of its worker that connects with pscluster.connect() from its task.
//  - The whole example (8 epochs, BSP summing both ranks' gradients, Adam on the servers) ends
//    with a test accuracy >= 0.88, within 0.5 points of the same script in one process with
//    torch.optim.Adam and the same examples per step (run here, after the job).
//  - Rank 1's python process killed with SIGKILL mid-job: the rank is handed over (a new attempt
//    resumes at the step the servers have for it) and the job succeeds with both ranks' models
//    equal and trained.
// Needs numpy and torch for /usr/bin/python3 (Debian's python3-numpy, python3-torch) and the
// Fashion-MNIST files in /usr/share/datasets/fashion-mnist. Tagged slow: about 4 minutes on 2
// cores.
#include <dirent.h>
#include <signal.h>

#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/e2e_cluster.h"

namespace pscluster::testing {
namespace {

constexpr char kPython[] = "/usr/bin/python3";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Script() { return Runfile("deploy/examples/torch_mlp/train.py"); }

// The entrypoint job running train.py with `args` (after the script).
std::string JobYaml(const std::string& name, const std::string& args, int epochs) {
  return absl::StrCat("name: ", name, "\nentrypoint:\n  command: [", kPython, ", ", Script(),
                      ", --threads=1", args, "]\n  env:\n    PYTHONPATH: ", Runfile("python/pkg"),
                      R"(
optimizer:
  kind: adam
  learning_rate: 0.001
consistency:
  mode: bsp
  aggregate: true
num_servers: 2
num_workers: 2
batch_size: 64
seed: 1
epochs: )", epochs, "\n");
}

// test_accuracy of train.py's final JSON line in `line`, or -1.
double Accuracy(absl::string_view line) {
  constexpr absl::string_view kKey = "\"test_accuracy\": ";
  size_t at = line.find(kKey);
  if (at == absl::string_view::npos) return -1;
  absl::string_view rest = line.substr(at + kKey.size());
  rest = rest.substr(0, rest.find_first_of(",}"));
  double v = -1;
  return absl::SimpleAtod(rest, &v) ? v : -1;
}

// Every rank's final accuracy from `psctl logs JOB` ("[rank N] {...}" lines).
std::map<int, double> RankAccuracies(E2eCluster& c, const std::string& job) {
  std::map<int, double> acc;
  CommandResult logs = c.Psctl({"logs", job});
  EXPECT_EQ(logs.exit_code, 0) << logs.output;
  for (absl::string_view line : absl::StrSplit(logs.output, '\n')) {
    if (!absl::StrContains(line, "\"mode\": \"pscluster\"")) continue;
    for (int r = 0; r < 2; ++r) {
      if (absl::StrContains(line, absl::StrCat("[rank ", r, "] "))) acc[r] = Accuracy(line);
    }
  }
  return acc;
}

// The pid of the process running train.py for `job` as rank `rank` (from /proc: its command line
// and its PSCLUSTER_ environment), or 0.
pid_t FindRank(const std::string& job, int rank) {
  DIR* d = opendir("/proc");
  if (d == nullptr) return 0;
  pid_t found = 0;
  const std::string job_var = absl::StrCat("PSCLUSTER_JOB_ID=", job, std::string(1, '\0'));
  const std::string rank_var = absl::StrCat("PSCLUSTER_RANK=", rank, std::string(1, '\0'));
  while (dirent* e = readdir(d)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    if (!absl::StrContains(ReadAll(absl::StrCat("/proc/", pid, "/cmdline")), "train.py")) continue;
    const std::string env = ReadAll(absl::StrCat("/proc/", pid, "/environ"));
    if (absl::StrContains(env, job_var) && absl::StrContains(env, rank_var)) found = pid;
  }
  closedir(d);
  return found;
}

std::unique_ptr<E2eCluster> StartCluster(const std::string& name) {
  E2eClusterOptions o;
  o.worker_args = {"--entrypoint_grace_sec=2"};
  auto cluster = E2eCluster::Start(name, o);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

TEST(E2eTorchEntrypointTest, TrainsAsWellAsOneProcessWithTorchAdam) {
  auto cluster = StartCluster("torch_accuracy");
  ASSERT_NE(cluster, nullptr);
  E2eCluster& c = *cluster;
  CommandResult submit =
      c.Psctl({"submit", c.WriteFile("mlp.yaml", JobYaml("torch-mlp", "", 8))});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  const std::string job(absl::StripAsciiWhitespace(submit.output));
  auto done = c.WaitForEnd(job, absl::Seconds(900));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails(60);
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->DebugString() << c.LogTails(60);
  // The script's progress reached the scheduler: the last step of 8 epochs of 60000 / 2 / 64.
  EXPECT_EQ(done->progress().total_steps(), 8 * 468) << done->progress().DebugString();
  std::map<int, double> acc = RankAccuracies(c, job);
  ASSERT_EQ(acc.size(), 2u);
  EXPECT_EQ(acc[0], acc[1]) << "BSP: both ranks end with the same parameters";

  // The same script in one process with torch.optim.Adam, 2 x 64 examples per step.
  CommandResult local = RunCommand(
      kPython, {Script(), "--local", "--threads=1", "--epochs=8", "--batch_size=128", "--seed=1"},
      absl::Seconds(900));
  ASSERT_EQ(local.exit_code, 0) << local.output;
  const double base = Accuracy(local.output);
  ASSERT_GT(base, 0) << local.output;
  std::cout << "e2e_torch_entrypoint_test: entrypoint job (2 servers, 2 workers) test accuracy "
            << acc[0] << ", one process with torch.optim.Adam " << base << ", difference "
            << 100 * (acc[0] - base) << " points\n";
  EXPECT_GE(acc[0], 0.88);
  EXPECT_GE(acc[0], base - 0.005);
}

TEST(E2eTorchEntrypointTest, KilledRankIsHandedOverAndTheJobSucceeds) {
  auto cluster = StartCluster("torch_kill");
  ASSERT_NE(cluster, nullptr);
  E2eCluster& c = *cluster;
  CommandResult submit = c.Psctl(
      {"submit", c.WriteFile("kill.yaml", JobYaml("torch-kill", ", --max_steps=600", 2))});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  const std::string job(absl::StripAsciiWhitespace(submit.output));

  // Rank 1 trains (its progress lines come every 50 steps); then its python3 is killed.
  v1::Job seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(300), [&] {
    auto j = c.GetJob(job);
    if (j.ok()) seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().workers_size() == 2 &&
           j->progress().workers(1).step() >= 100;
  })) << seen.DebugString() << c.LogTails();
  const pid_t pid = FindRank(job, 1);
  ASSERT_GT(pid, 0) << c.LogTails();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);

  auto done = c.WaitForEnd(job, absl::Seconds(600));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails(60);
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->DebugString() << c.LogTails(60);
  EXPECT_GE(done->recovery().handovers(), 1) << done->DebugString();
  // The new attempt resumed where the servers had the rank, not from step 0, and ended at 600.
  CommandResult logs = c.Psctl({"logs", job, "--rank=1"});
  ASSERT_EQ(logs.exit_code, 0) << logs.output;
  EXPECT_THAT(logs.output, ::testing::ContainsRegex("\"steps\": 600, \"start_step\": [1-9]"))
      << logs.output;
  std::map<int, double> acc = RankAccuracies(c, job);
  ASSERT_EQ(acc.size(), 2u);
  EXPECT_EQ(acc[0], acc[1]) << "BSP: both ranks end with the same parameters";
  EXPECT_GE(acc[0], 0.80) << "600 steps of 128 examples";
  std::cout << "e2e_torch_entrypoint_test: rank 1 killed at step >= 100, handed over "
            << done->recovery().handovers() << " time(s); test accuracy after 600 steps "
            << acc[0] << "\n";
}

}  // namespace
}  // namespace pscluster::testing
