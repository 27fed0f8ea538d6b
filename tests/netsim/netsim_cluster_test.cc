// The real daemons on separate hosts of a netsim network (1 Gbit/s links): the scheduler, two
// servers and three workers each in a network namespace of its own, so that workers reach the
// servers over TCP through their links (never the Unix socket or shared memory of one host).
//
// A job trains on two of the workers. Then one training worker's link is taken down at the
// switch — the host is cut off from everyone, the scheduler and the servers alike: its
// heartbeats stop, its lease lapses, and the scheduler hands its rank to the idle third worker,
// whose task the servers fence in first. When the link is up again, the cut-off worker's next
// call is refused (its attempt was replaced), its task stops by itself, and the worker joins the
// cluster again. The job succeeds with every update applied exactly once.
//
// Needs root (skips, saying why, elsewhere).

#include "tests/netsim/netsim_cluster.h"

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/wait_for.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/e2e_cluster.h"
#include "tests/cluster/exactly_once.h"

namespace pscluster::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

constexpr int kEpochs = 3;  // 300 steps per epoch and worker.
constexpr int kCheckpointEvery = 150;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(NetsimClusterTest, TrainsAcrossHostsOverTcpAndRecoversFromAWorkerWhoseLinkGoesDown) {
  NetsimClusterOptions o;
  o.servers = 2;
  o.workers = 3;
  o.rate = "1gbit";
  auto cluster = NetsimCluster::Start("netsim_cluster", o);
  if (IsUnsupported(cluster.status())) GTEST_SKIP() << cluster.status();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  NetsimCluster& c = **cluster;

  const std::string ckpt = c.dir() + "/ckpt";
  const std::string yaml =
      absl::StrCat(FashionJobYaml("across_hosts", kEpochs, ""),
                   "checkpoint_every_steps: ", kCheckpointEvery, "\ncheckpoint_dir: ", ckpt, "\n");
  CommandResult submit = c.Psctl({"submit", c.WriteFile("job.yaml", yaml)});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  const std::string id = "job-1";
  v1::Job seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(60),
                      [&] {
                        auto j = c.GetJob(id);
                        if (j.ok()) seen = *j;
                        return j.ok() && j->state() == v1::JOB_RUNNING &&
                               j->progress().step() >= 100;
                      }))
      << seen.DebugString() << c.LogTails();
  ASSERT_THAT(seen.workers(), SizeIs(2));

  // Each training worker reached both servers over TCP at their hosts' addresses.
  for (const std::string& node : seen.workers()) {
    const std::string host = c.HostOfNode(node);
    ASSERT_FALSE(host.empty()) << node;
    const std::string log = ReadAll(c.LogFile(host));
    for (const char* server : {"server-1", "server-2"}) {
      EXPECT_THAT(log, HasSubstr(absl::StrCat("data plane to ", c.Address(server), " over tcp")))
          << host;
    }
    EXPECT_THAT(log, Not(HasSubstr("over unix"))) << host;
    EXPECT_THAT(c.Address(host), Not(HasSubstr("127.0.0.1")));
  }

  // Rank 0's host goes off the network.
  const std::string cutoff_id = seen.workers(0);
  const std::string cutoff = c.HostOfNode(cutoff_id);
  ASSERT_TRUE(c.network().SetLinkUp(cutoff, false).ok());
  const absl::Time cut_at = absl::Now();
  ASSERT_TRUE(WaitFor(absl::Seconds(60),
                      [&] {
                        auto j = c.GetJob(id);
                        if (j.ok()) seen = *j;
                        return j.ok() && j->recovery().handovers() == 1;
                      }))
      << seen.DebugString() << c.LogTails();
  const absl::Duration detected = absl::Now() - cut_at;
  EXPECT_NE(seen.workers(0), cutoff_id);
  EXPECT_THAT(seen.recovery().last_cause(),
              HasSubstr(absl::StrCat("worker of rank 0 ", cutoff_id)));
  EXPECT_THAT(seen.recovery().last_cause(), HasSubstr("stopped heartbeating"));
  EXPECT_NE(c.NodeState(cutoff_id), v1::NODE_ALIVE);
  // The job moves on without the cut-off host.
  const int64_t step_at_handover = seen.progress().step();
  ASSERT_TRUE(WaitFor(absl::Seconds(60),
                      [&] {
                        auto j = c.GetJob(id);
                        if (j.ok()) seen = *j;
                        return j.ok() && j->progress().step() >= step_at_handover + 50;
                      }))
      << seen.DebugString() << c.LogTails();

  // The link comes back: the replaced task is refused and stops; the worker rejoins.
  ASSERT_TRUE(c.network().SetLinkUp(cutoff, true).ok());
  EXPECT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto ws = E2eCluster::WorkerStatusAt(c.Address(cutoff));
    return ws.ok() && !ws->busy() && c.NodeState(cutoff_id) == v1::NODE_ALIVE;
  })) << ReadAll(c.LogFile(cutoff));
  const std::string log = ReadAll(c.LogFile(cutoff));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("task stopped: job ", id, " rank 0")));
  EXPECT_THAT(log, Not(HasSubstr("task failed")));

  auto done = c.WaitForEnd(id, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status() << c.LogTails();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason() << c.LogTails();
  EXPECT_EQ(done->recovery().handovers(), 1u);
  EXPECT_EQ(done->recovery().recoveries(), 0u);
  EXPECT_EQ(done->progress().step(), kEpochs * 300);
  EXPECT_GE(done->progress().test_accuracy(), 0.8);
  ExpectEveryUpdateAppliedOnce(ckpt + "/" + id, *done);
  printf("link down detected and rank handed over in %s; test accuracy %.3f\n",
         absl::FormatDuration(detected).c_str(), done->progress().test_accuracy());
  if (HasFailure()) ADD_FAILURE() << c.LogTails(200) << "\ncut-off worker:\n" << log;
}

}  // namespace
}  // namespace pscluster::testing
