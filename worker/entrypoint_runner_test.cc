// EntrypointRunner with real child processes (sh scripts): the contract's environment and task
// file, output lines kept, progress lines turned into reports (malformed ones ignored), exit
// statuses mapped to the task's outcome, and Cancel stopping the whole process group.
#include "worker/entrypoint_runner.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace pscluster::worker {
namespace {

class RecordingSink final : public ProgressSink {
 public:
  bool Report(const v1::WorkerProgress& p) override {
    absl::MutexLock l(&mu_);
    reports_.push_back(p);
    return true;
  }
  absl::StatusOr<v1::ShardMap> RefreshShardMap() override {
    return absl::UnavailableError("no scheduler");
  }
  std::vector<v1::WorkerProgress> reports() {
    absl::MutexLock l(&mu_);
    return reports_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::WorkerProgress> reports_;
};

std::string TempDir() {
  const char* t = getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

v1::AssignTaskRequest Task(const std::string& script) {
  v1::AssignTaskRequest t;
  t.set_job_id("job-7");
  t.set_rank(1);
  t.set_num_workers(2);
  t.set_attempt(3);
  t.mutable_spec()->set_name("mine");
  auto* e = t.mutable_spec()->mutable_entrypoint();
  e->add_command("sh");
  e->add_command("-c");
  e->add_command(script);
  e->set_working_dir(TempDir());
  (*e->mutable_env())["GREETING"] = "hello there";
  t.mutable_shard_map()->set_epoch(4);
  return t;
}

struct Outcome {
  absl::Status status;
  std::vector<v1::WorkerProgress> reports;
  v1::TaskLogsResponse logs;
};

Outcome RunScript(const std::string& script, TaskLogBook* book,
                  std::function<void(EntrypointRunner&)> during = nullptr) {
  RecordingSink sink;
  EntrypointOptions o;
  o.allow = true;
  o.scheduler = "127.0.0.1:1";
  o.logs = book;
  o.temp_root = TempDir();
  o.stop_grace = absl::Seconds(1);
  auto r = EntrypointRunner::Create(Task(script), o, &sink);
  EXPECT_TRUE(r.ok()) << r.status();
  Outcome out;
  std::thread other;
  if (during) other = std::thread([&] { during(**r); });
  out.status = (*r)->Run();
  if (other.joinable()) other.join();
  out.reports = sink.reports();
  v1::TaskLogsRequest req;
  req.set_job_id("job-7");
  req.set_rank(1);
  auto logs = book->Read(req);
  if (logs.ok()) out.logs = *logs;
  return out;
}

std::string Text(const v1::TaskLogsResponse& logs) {
  std::string s;
  for (const auto& l : logs.lines()) absl::StrAppend(&s, l.stream(), ":", l.text(), "\n");
  return s;
}

TEST(EntrypointRunnerTest, RefusedUnlessAllowed) {
  RecordingSink sink;
  EntrypointOptions o;
  auto r = EntrypointRunner::Create(Task("true"), o, &sink);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("--allow_entrypoints"), std::string::npos);
}

TEST(EntrypointRunnerTest, ContractEnvironmentOutputAndProgress) {
  TaskLogBook book;
  const std::string script =
      "echo job=$PSCLUSTER_JOB_ID rank=$PSCLUSTER_RANK of=$PSCLUSTER_NUM_WORKERS "
      "attempt=$PSCLUSTER_ATTEMPT sched=$PSCLUSTER_SCHEDULER fd=$PSCLUSTER_PROGRESS_FD; "
      "echo \"greeting=$GREETING pwd=$(pwd)\"; "
      "stat -c 'mode=%a bytes=%s' \"$PSCLUSTER_TASK_FILE\"; "
      "stat -c 'dirmode=%a' \"$(dirname \"$PSCLUSTER_TASK_FILE\")\"; "
      "echo \"$PSCLUSTER_TASK_FILE\" > task_path.txt; "
      "echo oops >&2; "
      "echo 'not json' >&3; "
      "echo '{\"epoch\": 1}' >&3; "
      "echo '{\"step\": 5, \"epoch\": 0, \"examples\": 320, \"loss\": 0.5, "
      "\"total_steps\": 10, \"metrics\": {\"accuracy\": 0.75}}' >&3; "
      "printf 'no newline at the end'";
  Outcome o = RunScript(script, &book);
  ASSERT_TRUE(o.status.ok()) << o.status;
  const std::string text = Text(o.logs);
  EXPECT_NE(text.find("stdout:job=job-7 rank=1 of=2 attempt=3 sched=127.0.0.1:1 fd=3"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(absl::StrCat("stdout:greeting=hello there pwd=", TempDir())),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("stdout:mode=600 bytes="), std::string::npos) << text;
  EXPECT_NE(text.find("stdout:dirmode=700"), std::string::npos) << text;
  EXPECT_NE(text.find("stderr:oops"), std::string::npos) << text;
  EXPECT_NE(text.find("stdout:no newline at the end"), std::string::npos) << text;
  EXPECT_TRUE(o.logs.finished());
  EXPECT_EQ(o.logs.exit_code(), 0);
  // Two malformed lines ignored, one report.
  ASSERT_EQ(o.reports.size(), 1u);
  EXPECT_EQ(o.reports[0].step(), 5);
  EXPECT_EQ(o.reports[0].total_steps(), 10);
  EXPECT_DOUBLE_EQ(o.reports[0].loss(), 0.5);
  EXPECT_DOUBLE_EQ(o.reports[0].train_accuracy(), 0.75);
  EXPECT_EQ(o.reports[0].metrics().at("accuracy"), 0.75);
  EXPECT_EQ(o.reports[0].rank(), 1u);
  // The task's private directory is gone.
  std::ifstream in(TempDir() + "/task_path.txt");
  std::string path;
  std::getline(in, path);
  ASSERT_FALSE(path.empty());
  struct stat st;
  EXPECT_NE(::stat(path.c_str(), &st), 0) << path;
  EXPECT_NE(::stat(path.substr(0, path.rfind('/')).c_str(), &st), 0) << path;
}

TEST(EntrypointRunnerTest, ExitStatusesMapToOutcomes) {
  TaskLogBook book;
  Outcome retry = RunScript("exit 75", &book);
  EXPECT_EQ(retry.status.code(), absl::StatusCode::kUnavailable) << retry.status;
  Outcome failed = RunScript("echo bad things >&2; exit 3", &book);
  EXPECT_EQ(failed.status.code(), absl::StatusCode::kUnknown);
  EXPECT_NE(failed.status.message().find("exit status 3"), std::string::npos) << failed.status;
  EXPECT_NE(failed.status.message().find("bad things"), std::string::npos) << failed.status;
  EXPECT_EQ(failed.logs.exit_code(), 3);
  Outcome killed = RunScript("kill -9 $$", &book);
  EXPECT_EQ(killed.status.code(), absl::StatusCode::kUnavailable) << killed.status;
  EXPECT_NE(killed.status.message().find("signal 9"), std::string::npos) << killed.status;
}

TEST(EntrypointRunnerTest, MissingCommandAndDirectoryAreNamed) {
  TaskLogBook book;
  RecordingSink sink;
  EntrypointOptions o;
  o.allow = true;
  o.logs = &book;
  v1::AssignTaskRequest t = Task("true");
  t.mutable_spec()->mutable_entrypoint()->set_command(0, "no-such-program-here");
  auto r = EntrypointRunner::Create(t, o, &sink);
  ASSERT_TRUE(r.ok());
  absl::Status s = (*r)->Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("entrypoint.command[0]"), std::string::npos) << s;

  v1::AssignTaskRequest d = Task("true");
  d.mutable_spec()->mutable_entrypoint()->set_working_dir("/no/such/dir");
  auto r2 = EntrypointRunner::Create(d, o, &sink);
  ASSERT_TRUE(r2.ok());
  s = (*r2)->Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("entrypoint.working_dir"), std::string::npos) << s;
}

TEST(EntrypointRunnerTest, CudaGraphsAreRefusedNotIgnored) {
  RecordingSink sink;
  EntrypointOptions o;
  o.allow = true;
  v1::AssignTaskRequest t = Task("true");
  t.mutable_spec()->set_cuda_graphs(true);
  auto r = EntrypointRunner::Create(t, o, &sink);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("spec.cuda_graphs"), std::string::npos) << r.status();
}

TEST(EntrypointRunnerTest, CancelStopsTheProcessGroupEvenWhenSigtermIsIgnored) {
  TaskLogBook book;
  const std::string pidfile = TempDir() + "/grandchild.pid";
  // The script ignores SIGTERM and leaves a grandchild behind; both must go.
  const std::string script = absl::StrCat(
      "trap '' TERM; (trap '' TERM; sleep 300) & echo $! > ", pidfile,
      "; echo started; while true; do sleep 0.1; done");
  Outcome o = RunScript(script, &book, [&](EntrypointRunner& r) {
    // Wait for the script to start (its first line), then stop it.
    for (int i = 0; i < 600; ++i) {
      v1::TaskLogsRequest req;
      req.set_job_id("job-7");
      req.set_rank(1);
      auto l = book.Read(req);
      if (l.ok() && l->lines_size() > 0) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    r.Cancel("stopped by the test");
  });
  EXPECT_EQ(o.status.code(), absl::StatusCode::kCancelled) << o.status;
  std::ifstream in(pidfile);
  pid_t grandchild = 0;
  in >> grandchild;
  ASSERT_GT(grandchild, 0);
  // Gone (or a zombie of init's, not ours to reap): no longer signalable as a sleeping process.
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    std::ifstream stat(absl::StrCat("/proc/", grandchild, "/stat"));
    std::string all;
    std::getline(stat, all);
    gone = all.empty() || all.find(") Z") != std::string::npos;
    if (!gone) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(gone);
}

TEST(EntrypointRunnerTest, ProgressLineParsing) {
  EXPECT_TRUE(ParseProgressLine("{\"step\": 3}").ok());
  EXPECT_TRUE(ParseProgressLine("{\"step\": 3, \"future_field\": true}").ok());
  EXPECT_EQ(ParseProgressLine("{\"loss\": 1}").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProgressLine("{\"step\": -1}").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProgressLine("[1, 2]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProgressLine("{\"step\": \"x\"}").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TaskLogBookTest, BoundedAndFollowable) {
  TaskLogLimits lim;
  lim.max_lines = 3;
  lim.max_tasks = 2;
  TaskLogBook book(lim);
  book.Begin("j", 0, 0);
  for (int i = 0; i < 5; ++i) book.Append("j", 0, 0, "stdout", absl::StrCat("line ", i));
  book.Append("j", 0, 9, "stdout", "from another attempt");  // Ignored.
  v1::TaskLogsRequest req;
  req.set_job_id("j");
  auto r = book.Read(req);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->lines_size(), 3);
  EXPECT_EQ(r->lines(0).text(), "line 2");
  EXPECT_FALSE(r->finished());
  req.set_after_seq(r->next_seq());
  book.Append("j", 0, 0, "stderr", "last");
  book.Finish("j", 0, 0, 3);
  r = book.Read(req);
  ASSERT_EQ(r->lines_size(), 1);
  EXPECT_EQ(r->lines(0).text(), "last");
  EXPECT_TRUE(r->finished());
  EXPECT_EQ(r->exit_code(), 3);
  book.Begin("k", 0, 0);
  book.Begin("l", 0, 0);  // Evicts the finished j.
  req.set_after_seq(0);
  EXPECT_EQ(book.Read(req).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pscluster::worker
