// End to end with the real daemons: data balancing. A Fashion-MNIST job with `balance_data:
// true` runs on 2 servers and 2 workers; the worker of rank 1 is made a straggler by stopping
// and continuing its process (SIGSTOP / SIGCONT) every few milliseconds, so that it computes at
// about half the speed of rank 0. The scheduler sees the two compute rates and gives rank 0 the
// larger part of the training set and batch; status shows the split, the ranks' batches and the
// count; the job succeeds with the accuracy of an undisturbed run.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/e2e_cluster.h"

namespace pscluster::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr int kEpochs = 40;  // 300 steps per epoch.

TEST(E2eBalanceTest, AStragglerGetsTheSmallerPartAndTheJobSucceeds) {
  E2eClusterOptions o;
  o.servers = 2;
  o.workers = 2;
  o.scheduler_args = {"--data_balance_every_ms=3000"};
  auto cluster = E2eCluster::Start("balance", o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string id = "job-1";
  std::string yaml = absl::StrCat(FashionJobYaml("balanced", kEpochs, ""), "balance_data: true\n");
  CommandResult submit = c.Psctl({"submit", c.WriteFile("job.yaml", yaml)});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  v1::Job seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(120), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= 20;
  })) << seen.DebugString() << c.LogTails();
  ASSERT_THAT(seen.workers(), SizeIs(2));
  const std::string slow = seen.workers(1);

  // Rank 1's worker runs 8 ms of every 20.
  std::atomic<bool> stop{false};
  std::thread straggle([&] {
    while (!stop.load()) {
      (void)c.processes().Signal(slow, SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(12));
      (void)c.processes().Signal(slow, SIGCONT);
      std::this_thread::sleep_for(std::chrono::milliseconds(8));
    }
    (void)c.processes().Signal(slow, SIGCONT);
  });
  const bool balanced = WaitFor(absl::Seconds(90), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->recovery().rebalances() >= 1 &&
           j->recovery().data_shares_size() == 2 &&
           j->recovery().data_shares(0) > 1.3 * j->recovery().data_shares(1);
  });
  CommandResult status = c.Psctl({"status", id});
  // The faster rank reads the larger part, in larger batches, from its next batch on.
  const bool batches = balanced && WaitFor(absl::Seconds(60), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->progress().workers_size() == 2 &&
           j->progress().workers(0).batch_size() > 100 &&
           j->progress().workers(1).batch_size() < 100;
  });
  stop.store(true);
  straggle.join();
  ASSERT_TRUE(balanced) << seen.DebugString() << c.LogTails();
  ASSERT_TRUE(batches) << seen.DebugString() << c.LogTails();
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("Data balance:  rank 0 ")) << status.output;
  EXPECT_THAT(status.output, HasSubstr("BATCH")) << status.output;
  std::cout << status.output;
  auto metrics = c.SchedulerMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("pscluster_scheduler_data_rebalances_total"));
  EXPECT_THAT(*metrics, ::testing::Not(HasSubstr("pscluster_scheduler_data_rebalances_total 0")));

  const v1::WorkerProgress& w0 = seen.progress().workers(0);
  const v1::WorkerProgress& w1 = seen.progress().workers(1);
  EXPECT_GT(w0.batch_size(), w1.batch_size());
  EXPECT_GT(w0.examples(), w1.examples());
  EXPECT_NEAR(w0.batch_size() + w1.batch_size(), 200, 1) << "the job's examples per step";
  EXPECT_NEAR(w0.examples() + w1.examples(), 60000, 1);

  auto done = c.WaitForEnd(id, absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().recoveries(), 0u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(done->progress().workers(r).step(), kEpochs * 300) << "rank " << r;
  }
  EXPECT_GE(done->progress().test_accuracy(), 0.84) << done->DebugString();
}

}  // namespace
}  // namespace pscluster::testing
