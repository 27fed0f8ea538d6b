// Cluster tier: the psctl binary against a real ps_scheduler process, with in-process stand-in
// servers and workers (real gRPC on loopback) simulating the training.
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/channel.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/scheduler.pb.h"
#include "scheduler/testing/fake_nodes.h"
#include "tests/cluster/scheduler_cluster_fixture.h"
#include "yaml-cpp/yaml.h"

namespace pscluster::testing {
namespace {

using scheduler::testing::FakeNode;
using scheduler::testing::FakeNodeOptions;
using scheduler::testing::SimulatedTraining;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kJob[] = R"(# A small job for the CLI tests.
name: cli-job
model:
  kind: mlp
  hidden: [16]
dataset:
  name: fashion_mnist
optimizer:
  kind: adam
  learning_rate: 0.001
consistency:
  mode: bsp
num_servers: 2
num_workers: 2
epochs: 1
batch_size: 32
export_path: /models/cli-job.safetensors
)";

class PsctlCliTest : public ::testing::Test {
 protected:
  void StartCluster(SimulatedTraining training) {
    dir_ = TestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    auto s = SchedulerProcess::Start(dir_, dir_ + "/s.db", "127.0.0.1:0", {"--lease_ms=5000", "--startup_grace_ms=300"});
    ASSERT_TRUE(s.ok()) << s.status();
    sched_ = std::move(*s);
    started_ = absl::Now();
    for (int i = 0; i < 4; ++i) {
      FakeNodeOptions o;
      o.role = i < 2 ? v1::ROLE_SERVER : v1::ROLE_WORKER;
      o.scheduler_address = sched_->address();
      o.capacity.set_cpu_slots(1);
      o.capacity.set_memory_bytes(uint64_t{2} << 30);
      o.training = training;
      auto n = FakeNode::Start(o);
      ASSERT_TRUE(n.ok()) << n.status();
      ASSERT_TRUE((*n)->WaitRegistered(absl::Seconds(10)));
      nodes_.push_back(std::move(*n));
    }
  }
  // Past the scheduler's start-up grace (--startup_grace_ms), oversized jobs are refused.
  void PastStartupGrace() {
    absl::Duration left = started_ + absl::Milliseconds(400) - absl::Now();
    if (left > absl::ZeroDuration()) absl::SleepFor(left);
  }
  std::string WriteJob(const std::string& name, const std::string& text) {
    std::string path = absl::StrCat(dir_, "/", name);
    std::ofstream(path) << text;
    return path;
  }
  CommandResult Psctl(std::vector<std::string> args, absl::Duration timeout = absl::Seconds(30)) {
    args.insert(args.begin(), absl::StrCat("--scheduler=", sched_->address()));
    args.insert(args.begin(), "--interval=100ms");
    return RunCommand(Runfile("scheduler/psctl"), args, timeout);
  }

  std::string dir_;
  absl::Time started_;
  std::unique_ptr<SchedulerProcess> sched_;
  std::vector<std::unique_ptr<FakeNode>> nodes_;
};

SimulatedTraining Quick() {
  SimulatedTraining t;
  t.total_steps = 20;
  t.step_time = absl::Milliseconds(15);
  t.report_every = 4;
  t.test_accuracy = 0.8812;
  return t;
}

TEST_F(PsctlCliTest, SubmitWaitStatusJsonJobsNodesShards) {
  StartCluster(Quick());
  std::string job = WriteJob("job.yaml", kJob);
  CommandResult submit = Psctl({"submit", job, "--wait"});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  std::string id = std::vector<std::string>(absl::StrSplit(submit.output, '\n'))[0];
  EXPECT_EQ(id, "job-1");
  EXPECT_THAT(submit.output, HasSubstr("job-1 succeeded"));
  EXPECT_THAT(submit.output, HasSubstr("test accuracy 0.8812"));
  EXPECT_THAT(submit.output, HasSubstr("model exported to /models/cli-job.safetensors"));

  // status -o json: the Job message, accuracy included.
  CommandResult status = Psctl({"status", id, "-o", "json"});
  ASSERT_EQ(status.exit_code, 0) << status.output;
  v1::Job parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(status.output, &parsed).ok())
      << status.output;
  EXPECT_EQ(parsed.job_id(), id);
  EXPECT_EQ(parsed.state(), v1::JOB_SUCCEEDED);
  EXPECT_DOUBLE_EQ(parsed.progress().test_accuracy(), 0.8812);
  EXPECT_EQ(parsed.progress().step(), 20);
  EXPECT_EQ(parsed.export_path(), "/models/cli-job.safetensors");
  EXPECT_THAT(status.output, HasSubstr("\"test_accuracy\": 0.8812"));

  // The table view of the same job.
  CommandResult table = Psctl({"status", id});
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(table.output, HasSubstr("State:        succeeded"));
  EXPECT_THAT(table.output, HasSubstr("accuracy 0.8812"));
  EXPECT_THAT(table.output, HasSubstr("RANK"));

  CommandResult jobs = Psctl({"jobs"});
  ASSERT_EQ(jobs.exit_code, 0) << jobs.output;
  EXPECT_THAT(jobs.output, HasSubstr("JOB"));
  EXPECT_THAT(jobs.output, HasSubstr("cli-job"));
  EXPECT_THAT(jobs.output, HasSubstr("succeeded"));
  CommandResult active = Psctl({"jobs", "--active"});
  EXPECT_THAT(active.output, HasSubstr("No jobs."));

  CommandResult yaml = Psctl({"jobs", "-o", "yaml"});
  ASSERT_EQ(yaml.exit_code, 0) << yaml.output;
  YAML::Node y = YAML::Load(yaml.output);
  ASSERT_TRUE(y["jobs"].IsSequence()) << yaml.output;
  EXPECT_EQ(y["jobs"][0]["job_id"].as<std::string>(), id);
  EXPECT_EQ(y["jobs"][0]["state"].as<std::string>(), "JOB_SUCCEEDED");

  CommandResult nodes = Psctl({"nodes"});
  ASSERT_EQ(nodes.exit_code, 0) << nodes.output;
  for (const auto& n : nodes_) {
    EXPECT_THAT(nodes.output, HasSubstr(n->node_id()));
    EXPECT_THAT(nodes.output, HasSubstr(n->address()));
  }
  EXPECT_THAT(nodes.output, HasSubstr("alive"));
  CommandResult nodes_json = Psctl({"nodes", "-o", "json"});
  v1::ClusterStatusResponse cs;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(nodes_json.output, &cs).ok());
  EXPECT_EQ(cs.nodes_size(), 4);

  CommandResult shards = Psctl({"shards", id});
  ASSERT_EQ(shards.exit_code, 0) << shards.output;
  EXPECT_THAT(shards.output, HasSubstr("shard map epoch 1, 64 virtual shards on 2 servers"));
  EXPECT_THAT(shards.output, HasSubstr("\n63  "));
  CommandResult shards_json = Psctl({"shards", id, "-o", "json"});
  v1::ShardMap map;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(shards_json.output, &map).ok());
  EXPECT_EQ(map.assignments_size(), 64);

  CommandResult overview = Psctl({"status"});
  ASSERT_EQ(overview.exit_code, 0) << overview.output;
  EXPECT_THAT(overview.output, HasSubstr("No active jobs."));
}

TEST_F(PsctlCliTest, MalformedAndOversizedJobsGetClearErrors) {
  StartCluster(Quick());
  PastStartupGrace();
  std::string bad = WriteJob("bad.yaml", absl::StrReplaceAll(kJob, {{"epochs: 1", "epochs: -1"}}));
  CommandResult r = Psctl({"submit", bad});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("psctl: ", bad, ":15: epochs: must be >= 0")));

  std::string typo = WriteJob("typo.yaml", absl::StrReplaceAll(kJob, {{"batch_size", "batchsize"}}));
  r = Psctl({"submit", typo});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr(":16: batchsize: unknown field (did you mean 'batch_size'?)"));

  std::string big = WriteJob("big.yaml",
                             absl::StrReplaceAll(kJob, {{"num_workers: 2", "num_workers: 5"}}));
  r = Psctl({"submit", big});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("num_workers: the job asks for 5 workers but the cluster has 2 "
                                  "live"));

  r = Psctl({"submit", dir_ + "/missing.yaml"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr(dir_ + "/missing.yaml"));

  r = Psctl({"status", "job-404"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("no job 'job-404'"));
  r = Psctl({"move-shard", "job-404", "3", "server-1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("no job 'job-404'"));
  r = Psctl({"move-shard", "job-404", "three", "server-1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("move-shard: SHARD 'three' is not a shard number"));
  r = Psctl({"move-shard", "job-404", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("JOB SHARD SERVER"));
  // --help lists every command.
  r = Psctl({"--help"});
  for (const char* command : {"submit", "jobs", "status", "cancel", "nodes", "shards",
                              "move-shard", "up --local", "down"}) {
    EXPECT_THAT(r.output, HasSubstr(command)) << "psctl --help";
  }
  // A token file that cannot be read is a usage error naming the file.
  r = Psctl({"--token_file=" + dir_ + "/no-such-token", "jobs"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--token_file: "));
  EXPECT_THAT(r.output, HasSubstr(dir_ + "/no-such-token"));

  // None of them queued anything.
  r = Psctl({"jobs"});
  EXPECT_THAT(r.output, HasSubstr("No jobs."));
  for (const CommandResult& c : {r}) EXPECT_THAT(c.output, Not(HasSubstr("terminate")));
}

TEST_F(PsctlCliTest, WaitExitsNonZeroWhenTheJobFails) {
  SimulatedTraining t = Quick();
  t.fail_at_step = 8;
  t.report_every = 1;
  t.error = "NaN loss at step 8";
  StartCluster(t);
  std::string job = WriteJob("job.yaml", kJob);
  CommandResult r = Psctl({"submit", job, "--wait"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("job-1 failed"));
  EXPECT_THAT(r.output, HasSubstr("NaN loss at step 8"));
  CommandResult s = Psctl({"status", "job-1", "--watch"});
  EXPECT_EQ(s.exit_code, 1);
  EXPECT_THAT(s.output, HasSubstr("State:        failed"));
}

// status JOB --history: the progress points and events the scheduler kept, as JSON (every
// point) and as text; a job it does not know is named.
TEST_F(PsctlCliTest, StatusHistoryJsonAndText) {
  SimulatedTraining t = Quick();
  t.report_every = 2;
  StartCluster(t);
  std::string job = WriteJob("job.yaml", kJob);
  CommandResult submit = Psctl({"submit", job, "--wait"});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;

  CommandResult json = Psctl({"status", "job-1", "--history", "-o", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  v1::JobHistory h;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.output, &h).ok()) << json.output;
  ASSERT_GE(h.points_size(), 3) << json.output;
  for (int i = 1; i < h.points_size(); ++i) {
    EXPECT_GT(h.points(i).step(), h.points(i - 1).step()) << json.output;
    EXPECT_GE(h.points(i).unix_ms(), h.points(i - 1).unix_ms());
  }
  EXPECT_EQ(h.points(h.points_size() - 1).step(), 20);
  EXPECT_DOUBLE_EQ(h.points(h.points_size() - 1).test_accuracy(), 0.8812);
  std::vector<std::string> states;
  for (const v1::JobEvent& e : h.events()) {
    if (e.kind() == v1::JOB_EVENT_STATE) states.push_back(e.text().substr(0, e.text().find(':')));
  }
  EXPECT_THAT(states, ::testing::IsSupersetOf({"running", "succeeded"})) << json.output;

  CommandResult text = Psctl({"status", "job-1", "--history"});
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("progress points"));
  EXPECT_THAT(text.output, HasSubstr("TEST ACC"));
  EXPECT_THAT(text.output, HasSubstr("succeeded"));

  CommandResult unknown = Psctl({"status", "job-9", "--history"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.output, HasSubstr("no job 'job-9'"));
  CommandResult no_job = Psctl({"status", "--history"});
  EXPECT_EQ(no_job.exit_code, 2);
  EXPECT_THAT(no_job.output, HasSubstr("--history: name the job"));
}

// psctl export: what the scheduler refuses, naming why (the export itself, by a real worker, is
// in //tests/browser:status_page_test and the e2e tests).
TEST_F(PsctlCliTest, ExportRefusalsNameWhy) {
  SimulatedTraining slow = Quick();
  slow.total_steps = 100000;
  StartCluster(slow);
  std::string no_path = absl::StrReplaceAll(kJob, {{"export_path: /models/cli-job.safetensors\n", ""}});
  ASSERT_EQ(Psctl({"submit", WriteJob("job.yaml", no_path)}).exit_code, 0);
  for (int i = 0; i < 200; ++i) {
    CommandResult s = Psctl({"status", "job-1", "-o", "json"});
    if (s.output.find("JOB_RUNNING") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  CommandResult r = Psctl({"export", "job-1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("job-1 has no export_path: name a file (psctl export job-1 --to PATH)"));
  // The stand-in workers cannot export: the worker's refusal comes back naming it.
  r = Psctl({"export", "job-1", "--to=/tmp/never.safetensors"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("ExportModel to worker"));
  r = Psctl({"export", "job-7"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("no job 'job-7'"));
  ASSERT_EQ(Psctl({"cancel", "job-1"}).exit_code, 0);
  r = Psctl({"export", "job-1", "--to=/tmp/x.safetensors"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("job job-1 is cancelled: only a running job can be exported"));
  r = Psctl({"export"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("psctl export JOB [--to PATH]"));
}

TEST_F(PsctlCliTest, CancelAQueuedAndARunningJob) {
  SimulatedTraining slow = Quick();
  slow.total_steps = 100000;
  StartCluster(slow);
  std::string job = WriteJob("job.yaml", kJob);
  CommandResult a = Psctl({"submit", job});
  CommandResult b = Psctl({"submit", job, "-o", "json"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_THAT(b.output, HasSubstr("\"job_id\": \"job-2\""));
  CommandResult c = Psctl({"cancel", "job-2", "--reason=not needed"});
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_THAT(c.output, HasSubstr("job-2 cancelled"));
  c = Psctl({"cancel", "job-1"});
  EXPECT_THAT(c.output, HasSubstr("job-1 cancelled"));
  CommandResult s = Psctl({"status", "job-2", "-o", "yaml"});
  YAML::Node y = YAML::Load(s.output);
  EXPECT_EQ(y["state"].as<std::string>(), "JOB_CANCELLED");
  EXPECT_EQ(y["reason"].as<std::string>(), "cancelled: not needed");
}

TEST(PsctlUnreachableTest, NamesTheAddressAndTheDeadline) {
  CommandResult r = RunCommand(Runfile("scheduler/psctl"),
                               {"--scheduler=127.0.0.1:1", "--timeout=1s", "jobs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("cannot reach the scheduler at 127.0.0.1:1 within 1s"));
  EXPECT_THAT(r.output, Not(HasSubstr("terminate")));
  r = RunCommand(Runfile("scheduler/psctl"), {"--scheduler=nocolon", "jobs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--scheduler"));
  r = RunCommand(Runfile("scheduler/psctl"), {"status", "a", "b"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("usage: psctl"));
}

}  // namespace
}  // namespace pscluster::testing
