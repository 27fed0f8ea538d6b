// Cluster tier: the real ps_scheduler binary killed with SIGKILL mid-job and restarted on the
// same database and port. Servers and workers are in-process stand-ins that keep heartbeating
// and reporting through the outage, as the real daemons do.
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/testing/wait_for.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/testing/fake_nodes.h"
#include "tests/cluster/scheduler_cluster_fixture.h"

namespace pscluster::testing {
namespace {

using scheduler::testing::FakeNode;
using scheduler::testing::FakeNodeOptions;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr char kJob[] = R"(name: restart-job
model: {kind: mlp, hidden: [8]}
dataset: {name: fashion_mnist}
optimizer: {kind: sgd, learning_rate: 0.1}
num_servers: 2
num_workers: 2
epochs: 1
batch_size: 8
)";

class Client {
 public:
  explicit Client(const std::string& address) {
    stub_ = v1::Scheduler::NewStub(*MakeChannel(address));
  }
  absl::StatusOr<std::string> Submit(const std::string& yaml, const std::string& token) {
    v1::SubmitJobRequest req;
    req.set_yaml(yaml);
    req.set_client_token(token);
    v1::SubmitJobResponse resp;
    auto ctx = CallContext(absl::Seconds(5));
    grpc::Status s = stub_->SubmitJob(ctx.get(), req, &resp);
    if (!s.ok()) return absl::UnknownError(s.error_message());
    return resp.job_id();
  }
  v1::Job Get(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    auto ctx = CallContext(absl::Seconds(5));
    (void)stub_->GetJob(ctx.get(), req, &job);
    return job;
  }
  v1::ClusterStatusResponse Status() {
    v1::ClusterStatusResponse resp;
    auto ctx = CallContext(absl::Seconds(5));
    (void)stub_->ClusterStatus(ctx.get(), v1::ClusterStatusRequest(), &resp);
    return resp;
  }

 private:
  std::unique_ptr<v1::Scheduler::Stub> stub_;
};

TEST(SchedulerRestartTest, KillNineMidJobKeepsEveryJobWithoutDuplicates) {
  std::string dir = TestDir("restart");
  std::string db = dir + "/scheduler.db";
  auto sched = SchedulerProcess::Start(dir, db, "127.0.0.1:0", {"--lease_ms=4000"});
  ASSERT_TRUE(sched.ok()) << sched.status();
  const std::string address = (*sched)->address();

  std::vector<std::unique_ptr<FakeNode>> nodes;
  for (int i = 0; i < 4; ++i) {
    FakeNodeOptions o;
    o.role = i < 2 ? v1::ROLE_SERVER : v1::ROLE_WORKER;
    o.scheduler_address = address;
    o.capacity.set_cpu_slots(1);
    o.training.total_steps = 60;
    o.training.step_time = absl::Milliseconds(40);
    o.training.report_every = 5;
    o.training.test_accuracy = 0.87;
    auto n = FakeNode::Start(o);
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_TRUE((*n)->WaitRegistered(absl::Seconds(10)));
    nodes.push_back(std::move(*n));
  }
  std::vector<std::string> ids;
  for (const auto& n : nodes) ids.push_back(n->node_id());

  Client client(address);
  auto first = client.Submit(kJob, "first");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = client.Submit(kJob, "second");  // Waits for the workers of the first.
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(WaitFor(absl::Seconds(20), [&] { return client.Get(*first).progress().step() >= 10; }))
      << client.Get(*first).DebugString() << (*sched)->log();
  EXPECT_EQ(client.Get(*second).state(), v1::JOB_QUEUED);

  (*sched)->Kill();
  absl::SleepFor(absl::Milliseconds(300));  // Reports and heartbeats fail meanwhile.
  auto again = SchedulerProcess::Start(dir, db, absl::StrCat("127.0.0.1:", (*sched)->port()),
                                       {"--lease_ms=4000"});
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ((*again)->address(), address);

  // The running job carries on to the end, then the queued one runs.
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    return client.Get(*first).state() == v1::JOB_SUCCEEDED;
  })) << client.Get(*first).DebugString() << (*again)->log();
  EXPECT_DOUBLE_EQ(client.Get(*first).progress().test_accuracy(), 0.87);
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    return client.Get(*second).state() == v1::JOB_SUCCEEDED;
  })) << client.Get(*second).DebugString() << (*again)->log();

  // No job lost or duplicated, no node re-created, and no task handed out twice.
  v1::ClusterStatusResponse st = client.Status();
  ASSERT_THAT(st.jobs(), SizeIs(2));
  EXPECT_EQ(st.jobs(0).job_id(), *second);
  EXPECT_EQ(st.jobs(1).job_id(), *first);
  ASSERT_THAT(st.nodes(), SizeIs(4));
  for (const auto& n : st.nodes()) {
    EXPECT_THAT(ids, ::testing::Contains(n.info().node_id()));
  }
  for (int i = 2; i < 4; ++i) {
    auto tasks = nodes[i]->worker()->assigned();
    ASSERT_THAT(tasks, SizeIs(2)) << "worker " << ids[i];
    EXPECT_EQ(tasks[0].job_id(), *first);
    EXPECT_EQ(tasks[1].job_id(), *second);
  }
  // A retried submission after the restart finds the job made before it.
  auto retried = client.Submit(kJob, "first");
  ASSERT_TRUE(retried.ok());
  EXPECT_EQ(*retried, *first);
  EXPECT_THAT((*again)->log(), HasSubstr("restored 2 jobs"));
}

TEST(SchedulerRestartTest, ASecondSchedulerOnTheSameDatabaseIsRefused) {
  std::string dir = TestDir("locked");
  std::string db = dir + "/scheduler.db";
  auto sched = SchedulerProcess::Start(dir, db);
  ASSERT_TRUE(sched.ok()) << sched.status();
  CommandResult second = RunCommand(
      Runfile("scheduler/ps_scheduler"),
      {"--listen=127.0.0.1:0", absl::StrCat("--db=", db)}, absl::Seconds(20));
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_THAT(second.output, HasSubstr(db));
  EXPECT_THAT(second.output, HasSubstr("locked by another process"));
}

TEST(SchedulerRestartTest, BadFlagsAreNamed) {
  std::string dir = TestDir("flags");
  CommandResult r = RunCommand(Runfile("scheduler/ps_scheduler"),
                               {"--listen=127.0.0.1:0", "--db=" + dir + "/x.db", "--lease_ms=5"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--lease_ms"));
  r = RunCommand(Runfile("scheduler/ps_scheduler"),
                 {"--listen=nonsense", "--db=" + dir + "/y.db"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("nonsense"));
  r = RunCommand(Runfile("scheduler/ps_scheduler"),
                 {"--listen=127.0.0.1:0", "--db=/nonexistent-dir/s.db"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("/nonexistent-dir/s.db"));
}

}  // namespace
}  // namespace pscluster::testing
