// End to end with the real daemons: a worker dies and no idle worker can take its rank. The
// Fashion-MNIST job runs on 2 servers and both of the cluster's 2 workers; the worker of rank 0
// (the one that evaluates and exports) is killed with SIGKILL. Once its lease lapses the rank
// leaves the job: the servers stop waiting for it, rank 1 reads rank 0's data from its next batch
// on and becomes the lead rank, and the job trains on with one worker and no rollback. It
// succeeds with the accuracy of an undisturbed run, every update applied exactly once (rank 1's
// every step, rank 0's up to where it died), its model exported by rank 1, and status says what
// happened.
#include <signal.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/atomic_file.h"
#include "common/checkpoint_file.h"
#include "tests/cluster/e2e_cluster.h"
#include "tests/cluster/exactly_once.h"

namespace pscluster::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr int kEpochs = 4;               // 300 steps per epoch and worker.
constexpr int kCheckpointEvery = 150;

E2eClusterOptions TwoByTwo() {
  E2eClusterOptions o;
  o.servers = 2;
  o.workers = 2;
  return o;
}

// Submits the job (checkpoints under <dir>/ckpt), kills the worker of `rank` with SIGKILL once
// the job is past step 200, and waits until the rank has left the job (no idle worker).
void KillARankUntilItLeaves(E2eCluster& c, const std::string& name, int epochs,
                            const std::string& model, int rank, std::string* dead, v1::Job* seen) {
  std::string yaml = absl::StrCat(FashionJobYaml(name, epochs, model),
                                  "checkpoint_every_steps: ", kCheckpointEvery, "\n",
                                  "checkpoint_dir: ", c.dir(), "/ckpt\n");
  CommandResult submit = c.Psctl({"submit", c.WriteFile("job.yaml", yaml)});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  ASSERT_TRUE(WaitFor(absl::Seconds(120), [&] {
    auto j = c.GetJob("job-1");
    if (j.ok()) *seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= 200;
  })) << seen->DebugString() << c.LogTails();
  ASSERT_THAT(seen->workers(), SizeIs(2));
  *dead = seen->workers(rank);
  ASSERT_TRUE(c.processes().Signal(*dead, SIGKILL).ok()) << *dead;
  ASSERT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto j = c.GetJob("job-1");
    if (j.ok()) *seen = *j;
    return j.ok() && j->recovery().left_size() == 1 && j->recovery().left(0).step() > 0;
  })) << seen->DebugString() << c.LogTails();
}

TEST(E2eLeaveTest, AWorkerLostWithNoneIdleLeavesTheJobWhichSucceedsWithTheOtherAlone) {
  auto cluster = E2eCluster::Start("leave", TwoByTwo());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string ckpt = c.dir() + "/ckpt";
  const std::string model = c.dir() + "/out/model.safetensors";
  const std::string id = "job-1";
  std::string dead;
  v1::Job seen;
  // Rank 0 leaves the job; rank 1 trains on alone.
  ASSERT_NO_FATAL_FAILURE(KillARankUntilItLeaves(c, "shrinks", kEpochs, model, 0, &dead, &seen));
  EXPECT_EQ(seen.state(), v1::JOB_RUNNING);
  const v1::LeftRank left = seen.recovery().left(0);
  EXPECT_EQ(left.rank(), 0u);
  EXPECT_EQ(left.node_id(), dead);
  EXPECT_EQ(left.adopted_by(), 1u);
  EXPECT_THAT(left.cause(), HasSubstr(absl::StrCat("worker of rank 0 ", dead)));
  EXPECT_GE(left.step(), 200);
  CommandResult status = c.Psctl({"status", id});
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr(absl::StrCat("rank 0 at step ", left.step(), " (", dead)));
  EXPECT_THAT(status.output, HasSubstr("its data to rank 1; 1 of 2 ranks train on"));
  EXPECT_THAT(status.output, HasSubstr("left the job"));

  auto done = c.WaitForEnd(id, absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().recoveries(), 0u);
  EXPECT_EQ(done->recovery().handovers(), 0u);
  EXPECT_EQ(done->progress().rolled_back_to_step(), -1);
  EXPECT_EQ(done->progress().step(), kEpochs * 300);
  // Rank 1 evaluated and exported: the model is as good as an undisturbed run's (0.84 or more
  // after four epochs of this MLP).
  EXPECT_GE(done->progress().test_accuracy(), 0.84);
  // The job reports the evaluating rank's accuracy, not the last one rank 0 gave before it died.
  ASSERT_EQ(done->progress().workers_size(), 2);
  EXPECT_TRUE(done->progress().workers(0).left());
  EXPECT_EQ(done->progress().test_accuracy(), done->progress().workers(1).test_accuracy());
  EXPECT_EQ(done->progress().test_loss(), done->progress().workers(1).test_loss());
  EXPECT_EQ(done->export_path(), model);
  EXPECT_TRUE(ReadFile(model).ok()) << model;
  // Exactly once: every block was updated once per step of rank 1, and once per step rank 0
  // pushed before it died (plus the part of its last step that reached it, at most one).
  int blocks = 0;
  for (const std::string& s : done->servers()) {
    const std::string path = NewestCheckpoint(ckpt + "/" + id, s);
    ASSERT_FALSE(path.empty()) << s;
    auto h = ReadCheckpointHeader(path);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->step(), kEpochs * 300) << path;
    for (const auto& t : h->tables()) {
      for (const auto& b : t.blocks()) {
        EXPECT_GE(b.updates(), h->step() + left.step()) << path << " " << b.block();
        EXPECT_LE(b.updates(), h->step() + left.step() + 1) << path << " " << b.block();
        ++blocks;
      }
    }
  }
  EXPECT_GE(blocks, 4);
  if (HasFailure()) ADD_FAILURE() << c.LogTails(400);
  auto metrics = c.SchedulerMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("pscluster_scheduler_rank_leaves_total 1"));
  EXPECT_THAT(*metrics, HasSubstr("pscluster_scheduler_job_recoveries_total 0"));
}

// Then a worker comes back (a new ps_worker process): the rank that left rejoins the job on it,
// at the slowest step of the rank training, and reads its own data again; the job ends with both
// ranks and the model as good.
TEST(E2eLeaveTest, ARankThatLeftRejoinsWhenAWorkerComesBack) {
  auto cluster = E2eCluster::Start("rejoin", TwoByTwo());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string ckpt = c.dir() + "/ckpt";
  const std::string id = "job-1";
  std::string dead;
  v1::Job seen;
  // Long enough that the rank remaining alone is still training when the new worker has
  // registered (on a quiet machine it runs about a thousand steps a second; the worker takes
  // about one to start): a rank that rejoined at the last step would train none.
  constexpr int kRejoinEpochs = 16;
  ASSERT_NO_FATAL_FAILURE(KillARankUntilItLeaves(c, "regrows", kRejoinEpochs,
                                                 c.dir() + "/model.safetensors", 1, &dead, &seen));
  const int64_t left_at = seen.recovery().left(0).step();

  auto back = c.StartWorker("worker-9", c.scheduler_address());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto j = c.GetJob(id);
    if (j.ok()) seen = *j;
    return j.ok() && j->recovery().rejoins() == 1;
  })) << seen.DebugString() << c.LogTails();
  EXPECT_THAT(seen.recovery().left(), SizeIs(0));
  EXPECT_NE(seen.workers(1), dead);
  EXPECT_FALSE(seen.workers(1).empty());
  CommandResult status = c.Psctl({"status", id});
  EXPECT_THAT(status.output, HasSubstr("1 rejoin(s)"));

  auto done = c.WaitForEnd(id, absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().recoveries(), 0u);
  EXPECT_EQ(done->progress().step(), kRejoinEpochs * 300);
  EXPECT_TRUE(done->progress().workers(1).done());
  EXPECT_FALSE(done->progress().workers(1).left());
  EXPECT_GE(done->progress().test_accuracy(), 0.84);
  // Each block: every step of rank 0, rank 1's steps before it left, and its steps since it
  // rejoined (at most every step it missed minus none: fewer than two full runs).
  for (const std::string& s : done->servers()) {
    const std::string path = NewestCheckpoint(ckpt + "/" + id, s);
    ASSERT_FALSE(path.empty()) << s;
    auto h = ReadCheckpointHeader(path);
    ASSERT_TRUE(h.ok()) << h.status();
    for (const auto& t : h->tables()) {
      for (const auto& b : t.blocks()) {
        EXPECT_GT(b.updates(), h->step() + left_at) << path << " " << b.block();
        EXPECT_LT(b.updates(), 2 * h->step()) << path << " " << b.block();
      }
    }
  }
  auto metrics = c.SchedulerMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("pscluster_scheduler_rank_rejoins_total 1"));
  if (HasFailure()) ADD_FAILURE() << c.LogTails(400);
}

}  // namespace
}  // namespace pscluster::testing
