// End to end with the real daemons: jobs whose tasks run the user's own script (entrypoint) as
// child processes of real workers — the contract's environment and task file, progress lines in
// psctl status, output in psctl logs, exit statuses (0, 75 retried, 3 fails the job), a child
// killed with SIGKILL handed over, and a job refused when no worker allows entrypoints.
#include <signal.h>
#include <sys/stat.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/e2e_cluster.h"

namespace pscluster::testing {
namespace {

using ::testing::HasSubstr;

// The user's script (sh, no Python needed): records its pid per rank and attempt, checks its
// task file, prints to stdout and stderr, writes a malformed progress line and then one per
// step until the test creates DIR/release. MODE: "retry" (rank 0's first attempt exits 75),
// "fail" (rank 1 exits 3), anything else trains.
constexpr char kScript[] = R"SH(d="$1"; mode="$2"
r=$PSCLUSTER_RANK; a=$PSCLUSTER_ATTEMPT; fd=$PSCLUSTER_PROGRESS_FD
echo $$ > "$d/pid-$r-$a.tmp" && mv "$d/pid-$r-$a.tmp" "$d/pid-$r-$a"
test -s "$PSCLUSTER_TASK_FILE" || { echo "no task file" >&2; exit 4; }
echo "hello from rank $r of $PSCLUSTER_NUM_WORKERS in $PSCLUSTER_JOB_ID attempt $a ($SCRIPT_ENV)"
echo "a warning from rank $r" >&2
echo "this is not json" >&$fd
if [ "$mode" = retry ] && [ "$r" = 0 ] && [ "$a" = 0 ]; then exit 75; fi
if [ "$mode" = fail ] && [ "$r" = 1 ]; then echo "giving up" >&2; exit 3; fi
step=0
while [ ! -e "$d/release" ] && [ $step -lt 1200 ]; do
  step=$((step+1))
  echo "{\"step\": $step, \"epoch\": 0, \"examples\": $((step*32)), \"loss\": 0.5, \"total_steps\": 100000, \"metrics\": {\"accuracy\": 0.75}}" >&$fd
  sleep 0.05
done
echo "{\"step\": $((step+1)), \"epoch\": 1, \"total_steps\": $((step+1))}" >&$fd
echo "rank $r done"
)SH";

std::string JobYaml(const std::string& name, const std::string& script, const std::string& dir,
                    const std::string& mode) {
  return absl::StrCat("name: ", name, R"(
entrypoint:
  command: [sh, )", script, ", ", dir, ", ", mode, R"(]
  working_dir: )", dir, R"(
  env:
    SCRIPT_ENV: from-the-job
optimizer:
  kind: sgd
  learning_rate: 0.1
num_servers: 1
num_workers: 2
)");
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

pid_t ReadPid(const std::string& path) {
  std::ifstream in(path);
  pid_t pid = 0;
  in >> pid;
  return pid;
}

class E2eEntrypointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    E2eClusterOptions o;
    o.servers = 1;
    o.workers = 2;
    o.worker_args = {"--entrypoint_grace_sec=2"};
    auto cluster = E2eCluster::Start(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), o);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    dir_ = cluster_->dir();
    script_ = cluster_->WriteFile("train.sh", kScript);
  }
  std::string Submit(const std::string& name, const std::string& mode) {
    CommandResult r = cluster_->Psctl(
        {"submit", cluster_->WriteFile(name + ".yaml", JobYaml(name, script_, dir_, mode))});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return std::string(absl::StripAsciiWhitespace(r.output));
  }

  std::unique_ptr<E2eCluster> cluster_;
  std::string dir_, script_;
};

TEST_F(E2eEntrypointTest, ScriptSucceedsWithProgressInStatusAndOutputInLogs) {
  E2eCluster& c = *cluster_;
  const std::string job = Submit("mine", "train");
  v1::Job seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(40), [&] {
    auto j = c.GetJob(job);
    if (j.ok()) seen = *j;
    if (!j.ok() || j->state() != v1::JOB_RUNNING || j->progress().workers_size() != 2) {
      return false;
    }
    for (const auto& w : j->progress().workers()) {
      if (w.step() < 3) return false;
    }
    return true;
  })) << seen.DebugString() << c.LogTails();
  // The progress lines reached the scheduler: steps, the total, loss and the metrics.
  EXPECT_EQ(seen.progress().total_steps(), 100000);
  EXPECT_DOUBLE_EQ(seen.progress().workers(0).loss(), 0.5);
  EXPECT_DOUBLE_EQ(seen.progress().workers(0).train_accuracy(), 0.75);
  EXPECT_EQ(seen.progress().workers(1).metrics().at("accuracy"), 0.75);
  CommandResult status = c.Psctl({"status", job});
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("/100000")) << status.output;

  // psctl logs: every rank's stdout and stderr, through the scheduler from the workers.
  CommandResult logs = c.Psctl({"logs", job});
  ASSERT_EQ(logs.exit_code, 0) << logs.output;
  EXPECT_THAT(logs.output,
              HasSubstr(absl::StrCat("[rank 0] hello from rank 0 of 2 in ", job,
                                     " attempt 0 (from-the-job)")));
  EXPECT_THAT(logs.output, HasSubstr("[rank 1] a warning from rank 1"));
  CommandResult one = c.Psctl({"logs", job, "--rank=1"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_THAT(one.output, HasSubstr("hello from rank 1 of 2"));
  EXPECT_THAT(one.output, ::testing::Not(HasSubstr("rank 0")));
  // --follow runs until the job has ended, with the last lines.
  auto follow = c.StartPsctl({"logs", job, "--follow"});
  ASSERT_TRUE(follow.ok()) << follow.status();

  c.WriteFile("release", "");
  auto done = c.WaitForEnd(job, absl::Seconds(40));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  EXPECT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->DebugString() << c.LogTails();
  EXPECT_EQ((*follow)->Wait(absl::Seconds(30)), 0) << (*follow)->Output();
  EXPECT_THAT((*follow)->Output(), HasSubstr("[rank 0] rank 0 done"));
  EXPECT_THAT((*follow)->Output(), HasSubstr("[rank 1] rank 1 done"));
  // The malformed progress line was logged by the worker and ignored.
  EXPECT_THAT(c.LogTails(200), HasSubstr("progress line ignored"));
  // Each task's private directory is gone.
  CommandResult left = RunCommand(
      "/bin/sh",
      {"-c", absl::StrCat("ls -d ${TMPDIR:-/tmp}/pscluster-", job, "-rank* 2>/dev/null | wc -l")});
  EXPECT_EQ(absl::StripAsciiWhitespace(left.output), "0") << left.output;
}

TEST_F(E2eEntrypointTest, Exit75IsRetriedAndExit3FailsTheJobNamingTheStatus) {
  E2eCluster& c = *cluster_;
  c.WriteFile("release", "");  // Tasks that run finish at once.
  const std::string retried = Submit("retried", "retry");
  auto done = c.WaitForEnd(retried, absl::Seconds(50));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  EXPECT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->DebugString() << c.LogTails();
  EXPECT_TRUE(Exists(dir_ + "/pid-0-0"));
  // Rank 0 ran again, as a later attempt.
  bool again = false;
  for (int a = 1; a < 10; ++a) again = again || Exists(absl::StrCat(dir_, "/pid-0-", a));
  EXPECT_TRUE(again) << c.LogTails();

  const std::string failed = Submit("failed", "fail");
  done = c.WaitForEnd(failed, absl::Seconds(50));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  EXPECT_EQ(done->state(), v1::JOB_FAILED) << done->DebugString();
  EXPECT_THAT(done->reason(), HasSubstr("exited with exit status 3")) << done->reason();
  EXPECT_THAT(done->reason(), HasSubstr("giving up")) << done->reason();
}

TEST_F(E2eEntrypointTest, ChildKilledWithSigkillIsHandedOverAndTheJobSucceeds) {
  E2eCluster& c = *cluster_;
  const std::string job = Submit("killed", "train");
  const std::string first = dir_ + "/pid-1-0";
  ASSERT_TRUE(WaitFor(absl::Seconds(40), [&] {
    auto j = c.GetJob(job);
    return Exists(first) && j.ok() && j->state() == v1::JOB_RUNNING &&
           j->progress().workers_size() == 2 && j->progress().workers(1).step() >= 3;
  })) << c.LogTails();
  const pid_t pid = ReadPid(first);
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  // Rank 1 starts again (a later attempt), the job goes on.
  std::string again;
  ASSERT_TRUE(WaitFor(absl::Seconds(40), [&] {
    for (int a = 1; a < 10; ++a) {
      std::string p = absl::StrCat(dir_, "/pid-1-", a);
      if (Exists(p)) again = p;
    }
    return !again.empty();
  })) << c.LogTails();
  EXPECT_NE(ReadPid(again), pid);
  c.WriteFile("release", "");
  auto done = c.WaitForEnd(job, absl::Seconds(40));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  EXPECT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->DebugString() << c.LogTails();
}

TEST(E2eEntrypointRefusalTest, RefusedAtSubmissionWhenNoWorkerAllowsEntrypoints) {
  E2eClusterOptions o;
  o.servers = 1;
  o.workers = 1;
  o.worker_args = {"--allow_entrypoints=false"};
  auto cluster = E2eCluster::Start("refused", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  CommandResult r = c.Psctl(
      {"submit", c.WriteFile("job.yaml", JobYaml("mine", "/bin/true", c.dir(), "train"))});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("no live worker allows entrypoints")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--allow_entrypoints")) << r.output;
  auto jobs = c.ClusterStatus();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->jobs_size(), 0);
}

}  // namespace
}  // namespace pscluster::testing
