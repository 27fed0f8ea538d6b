// The etcd store and the leader election against a real etcd (Debian's etcd 3.4 on loopback,
// scheduler/testing/etcd_cluster.h): what the store keeps, writes fenced by the leader's term,
// a candidate taking over when the leader's lease lapses, a leader cut off from etcd stepping
// down before its lease can expire, and a three-member cluster losing a member.
#include "scheduler/etcd_store.h"

#include <signal.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/leader_election.h"
#include "scheduler/testing/etcd_cluster.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::EtcdCluster;

constexpr int64_t kTtl = 3;  // Seconds: the lease of the elections below.

std::string TmpDir(const std::string& name) {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::system(absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'").c_str());
  return dir;
}

v1::Job MakeJob(const std::string& id, int64_t submitted, v1::JobState state) {
  v1::Job j;
  j.set_job_id(id);
  j.set_submitted_unix_ms(submitted);
  j.set_state(state);
  j.mutable_spec()->set_name("n");
  return j;
}

LeaderElectionOptions Candidate(const std::string& name) {
  LeaderElectionOptions o;
  o.key = "/t/leader";
  o.value = name;
  o.ttl_seconds = kTtl;
  o.poll = absl::Milliseconds(50);
  return o;
}

class EtcdStoreTest : public ::testing::Test {
 protected:
  void StartEtcd(int members) {
    auto etcd = EtcdCluster::Start(
        TmpDir(::testing::UnitTest::GetInstance()->current_test_info()->name()), members);
    ASSERT_THAT(etcd, IsOk());
    etcd_ = std::move(*etcd);
    auto client = EtcdClient::Connect(etcd_->endpoints(), absl::Seconds(1));
    ASSERT_THAT(client, IsOk());
    client_ = std::move(*client);
  }
  // Campaigns and returns the term.
  int64_t Win(LeaderElection& e) {
    absl::Notification stop;
    auto term = e.Campaign(&stop);
    EXPECT_THAT(term, IsOk());
    return term.ok() ? *term : 0;
  }

  std::unique_ptr<EtcdCluster> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdStoreTest, KeepsCountersTheClusterKeyNodesAndJobsAsTheSqliteStoreDoes) {
  StartEtcd(1);
  LeaderElection a(client_.get(), Candidate("a"));
  const int64_t term = Win(a);
  ASSERT_GT(term, 0);
  {
    EtcdStore store(client_.get(), "/t/", "/t/leader", term);
    EXPECT_EQ(*store.NextId("job"), 1u);
    EXPECT_EQ(*store.NextId("job"), 2u);
    EXPECT_EQ(*store.NextId("server"), 1u);
    auto key = store.ClusterKey();
    ASSERT_THAT(key, IsOk());
    EXPECT_EQ(key->size(), 32u);
    EXPECT_EQ(*store.ClusterKey(), *key);

    ASSERT_THAT(store.PutJob(MakeJob("job-2", 200, v1::JOB_QUEUED), "tok", nullptr, "alice"),
                IsOk());
    v1::ShardMap map;
    map.set_job_id("job-1");
    map.set_epoch(2);
    ASSERT_THAT(store.PutJob(MakeJob("job-1", 100, v1::JOB_PLACING), "", &map, "bob"), IsOk());
    // An older epoch written later does not replace the map; the owner stays the first one.
    map.set_epoch(1);
    ASSERT_THAT(store.PutJob(MakeJob("job-1", 100, v1::JOB_RUNNING), "", &map, "mallory"), IsOk());
    // Jobs submitted in the same millisecond: by the id's number (job-10 after job-9).
    ASSERT_THAT(store.PutJob(MakeJob("job-10", 300, v1::JOB_QUEUED), ""), IsOk());
    ASSERT_THAT(store.PutJob(MakeJob("job-9", 300, v1::JOB_QUEUED), ""), IsOk());
    v1::NodeStatus n;
    n.mutable_info()->set_node_id("server-1");
    n.mutable_info()->set_address("h:1");
    n.set_state(v1::NODE_ALIVE);
    ASSERT_THAT(store.PutNode(n), IsOk());
    n.set_state(v1::NODE_DEAD);
    ASSERT_THAT(store.PutNode(n), IsOk());
  }
  // Another store (a scheduler that took over) reads it all back.
  EtcdStore again(client_.get(), "/t/", "/t/leader", term);
  EXPECT_EQ(*again.NextId("job"), 3u);
  auto nodes = again.LoadNodes();
  ASSERT_THAT(nodes, IsOk());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].state(), v1::NODE_DEAD);
  auto jobs = again.LoadJobs();
  ASSERT_THAT(jobs, IsOk());
  std::vector<std::string> ids;
  for (const StoredJob& j : *jobs) ids.push_back(j.job.job_id());
  EXPECT_THAT(ids, ElementsAre("job-1", "job-2", "job-9", "job-10"));
  EXPECT_EQ((*jobs)[0].job.state(), v1::JOB_RUNNING);
  EXPECT_EQ((*jobs)[0].shard_map.epoch(), 2u);
  EXPECT_EQ((*jobs)[0].owner, "bob");
  EXPECT_EQ((*jobs)[1].client_token, "tok");
  EXPECT_EQ((*jobs)[1].owner, "alice");
  EXPECT_EQ((*jobs)[1].shard_map.epoch(), 0u);
  EXPECT_THAT(again.path(), HasSubstr(absl::StrCat("etcd://", etcd_->endpoints(), "/t/")));

  // A record that is not one is refused by name, not half-read.
  ASSERT_THAT(client_->Put("/t/jobs/job-99", "not a record"), IsOk());
  EXPECT_THAT(again.LoadJobs(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("/t/jobs/job-99")));
  ASSERT_THAT(client_->Put("/t/counters/job", "x"), IsOk());
  EXPECT_THAT(again.NextId("job"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("counters/job")));
}

TEST_F(EtcdStoreTest, ADeposedLeadersWritesFailAndChangeNothing) {
  StartEtcd(1);
  LeaderElection a(client_.get(), Candidate("a"));
  const int64_t term_a = Win(a);
  EtcdStore store_a(client_.get(), "/t/", "/t/leader", term_a);
  ASSERT_THAT(store_a.PutJob(MakeJob("job-1", 100, v1::JOB_RUNNING), ""), IsOk());
  ASSERT_EQ(*store_a.NextId("job"), 1u);

  // a's lease goes (as when it dies or is cut off) and b is elected.
  a.Resign();
  LeaderElection b(client_.get(), Candidate("b"));
  const int64_t term_b = Win(b);
  EXPECT_GT(term_b, term_a);
  EXPECT_EQ(b.leader(), "b");

  // a, not knowing yet, tries to carry on: nothing it writes lands.
  v1::ShardMap late;
  late.set_job_id("job-1");
  late.set_epoch(7);
  EXPECT_THAT(store_a.PutJob(MakeJob("job-1", 100, v1::JOB_FAILED), "", &late),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no longer leads")));
  EXPECT_THAT(store_a.NextId("job"), StatusIs(absl::StatusCode::kFailedPrecondition));
  v1::NodeStatus n;
  n.mutable_info()->set_node_id("server-1");
  EXPECT_THAT(store_a.PutNode(n), StatusIs(absl::StatusCode::kFailedPrecondition));

  EtcdStore store_b(client_.get(), "/t/", "/t/leader", term_b);
  auto jobs = store_b.LoadJobs();
  ASSERT_THAT(jobs, IsOk());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].job.state(), v1::JOB_RUNNING);
  EXPECT_EQ((*jobs)[0].shard_map.epoch(), 0u);
  EXPECT_TRUE(store_b.LoadNodes()->empty());
  EXPECT_EQ(*store_b.NextId("job"), 2u);

  // Depose() fails writes at once, without asking etcd.
  store_b.Depose();
  EXPECT_THAT(store_b.NextId("job"), StatusIs(absl::StatusCode::kFailedPrecondition));
}

// Shard-map epochs come from etcd revisions: each is the revision of the fenced write that took
// it (the mod revision of <prefix>epochs/<job>), above the epoch it follows and above every
// revision before it, whichever leader took it; a deposed leader gets none.
TEST_F(EtcdStoreTest, ShardMapEpochsAreRevisionsOfFencedWrites) {
  StartEtcd(1);
  LeaderElection a(client_.get(), Candidate("a"));
  const int64_t term_a = Win(a);
  EtcdStore store_a(client_.get(), "/t/", "/t/leader", term_a);
  ASSERT_THAT(store_a.PutJob(MakeJob("job-1", 100, v1::JOB_RUNNING), ""), IsOk());
  auto first = store_a.NextEpoch("job-1", 0);
  ASSERT_THAT(first, IsOk());
  EXPECT_GT(*first, static_cast<uint64_t>(term_a));  // Written after the election.
  auto kv = client_->Get("/t/epochs/job-1");
  ASSERT_THAT(kv, IsOk());
  EXPECT_EQ(static_cast<uint64_t>(kv->mod_revision()), *first);
  // Other writes move etcd's revision on; the next epoch is above all of them.
  ASSERT_THAT(store_a.NextId("job"), IsOk());
  auto second = store_a.NextEpoch("job-1", *first);
  ASSERT_THAT(second, IsOk());
  EXPECT_GT(*second, *first + 1);
  EXPECT_EQ(static_cast<uint64_t>(client_->Get("/t/epochs/job-1")->mod_revision()), *second);
  // An epoch already above etcd's revision (a map from before the store moved to etcd) is
  // followed by a higher one.
  auto high = store_a.NextEpoch("job-2", 1000000);
  ASSERT_THAT(high, IsOk());
  EXPECT_EQ(*high, 1000001u);

  // a is deposed and b leads: a takes no epoch, b's are above a's.
  a.Resign();
  LeaderElection b(client_.get(), Candidate("b"));
  const int64_t term_b = Win(b);
  EXPECT_THAT(store_a.NextEpoch("job-1", *second),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no longer leads")));
  EXPECT_EQ(static_cast<uint64_t>(client_->Get("/t/epochs/job-1")->mod_revision()), *second);
  EtcdStore store_b(client_.get(), "/t/", "/t/leader", term_b);
  auto third = store_b.NextEpoch("job-1", *second);
  ASSERT_THAT(third, IsOk());
  EXPECT_GT(*third, static_cast<uint64_t>(term_b));
  EXPECT_GT(*third, *second);
}

TEST_F(EtcdStoreTest, ACandidateTakesOverOnlyOnceTheLeadersLeaseLapses) {
  StartEtcd(1);
  LeaderElection a(client_.get(), Candidate("a"));
  ASSERT_GT(Win(a), 0);
  absl::Notification stop_a;
  std::string why_a;
  std::thread lead_a([&] { why_a = a.KeepLeading(&stop_a); });

  LeaderElection b(client_.get(), Candidate("b"));
  absl::Notification stop_b;
  absl::StatusOr<int64_t> term_b;
  absl::Time won_b;
  std::thread campaign_b([&] {
    term_b = b.Campaign(&stop_b);
    won_b = absl::Now();
  });
  // While a renews its lease, b only follows it (three leases' worth).
  absl::SleepFor(absl::Seconds(3 * kTtl));
  EXPECT_EQ(b.leader(), "a");
  EXPECT_FALSE(term_b.ok() && *term_b > 0);

  // a dies without resigning: its renewals stop and the lease lapses.
  const absl::Time died = absl::Now();
  stop_a.Notify();
  lead_a.join();
  EXPECT_EQ(why_a, "stopped");
  campaign_b.join();
  ASSERT_THAT(term_b, IsOk());
  const absl::Duration takeover = won_b - died;
  std::printf("takeover after the leader stopped renewing: %s (lease %lld s)\n",
              absl::FormatDuration(takeover).c_str(), static_cast<long long>(kTtl));
  EXPECT_LE(takeover, absl::Seconds(kTtl + 2));
  EXPECT_EQ(b.leader(), "b");
  b.Resign();
}

TEST_F(EtcdStoreTest, ALeaderCutOffFromEtcdStepsDownBeforeItsLeaseCanExpire) {
  StartEtcd(3);
  LeaderElection a(client_.get(), Candidate("a"));
  const int64_t term = Win(a);
  absl::Notification stop;
  std::string why;
  absl::Time stepped_down;
  std::thread lead([&] {
    why = a.KeepLeading(&stop);
    stepped_down = absl::Now();
  });
  absl::SleepFor(absl::Seconds(2));
  // Every member stops answering (as when this scheduler's machine is cut off from them).
  for (int i = 0; i < etcd_->size(); ++i) etcd_->Pause(i);
  const absl::Time cut = absl::Now();
  lead.join();
  const absl::Time renewed = a.last_renewal();
  for (int i = 0; i < etcd_->size(); ++i) etcd_->Resume(i);
  EXPECT_THAT(why, HasSubstr("no lease renewal confirmed"));
  // The lease lasts at least kTtl past the last confirmed renewal; the leader gave up well before.
  const absl::Duration margin = renewed + absl::Seconds(kTtl) - stepped_down;
  std::printf("cut off %s after the last renewal; stepped down %s after the cut, %s before the "
              "lease could expire\n",
              absl::FormatDuration(cut - renewed).c_str(),
              absl::FormatDuration(stepped_down - cut).c_str(),
              absl::FormatDuration(margin).c_str());
  EXPECT_GE(margin, absl::Milliseconds(700));
  // Its store no longer writes once another leads (here: once its key is gone).
  a.Resign();
  LeaderElection b(client_.get(), Candidate("b"));
  const int64_t term_b = Win(b);
  EtcdStore stale(client_.get(), "/t/", "/t/leader", term);
  EXPECT_GT(term_b, term);
  EXPECT_THAT(stale.NextId("x"), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(EtcdStoreTest, LosingOneOfThreeMembersIsSurvived) {
  StartEtcd(3);
  LeaderElection a(client_.get(), Candidate("a"));
  const int64_t term = Win(a);
  absl::Notification stop;
  std::string why;
  std::thread lead([&] { why = a.KeepLeading(&stop); });
  EtcdStore store(client_.get(), "/t/", "/t/leader", term);
  ASSERT_EQ(*store.NextId("n"), 1u);
  etcd_->Kill(0);
  // Writes carry on through the other two members (a few may fail while etcd elects a new raft
  // leader, if the killed member led), and the scheduler keeps its leadership throughout.
  uint64_t last = 1;
  int failed = 0;
  const absl::Time until = absl::Now() + absl::Seconds(2 * kTtl);
  while (absl::Now() < until) {
    auto id = store.NextId("n");
    if (id.ok()) {
      EXPECT_EQ(*id, last + 1);
      last = *id;
    } else {
      ++failed;
      EXPECT_TRUE(absl::IsUnavailable(id.status()) || absl::IsDeadlineExceeded(id.status()))
          << id.status();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::printf("%d writes after the member was lost, %d failed\n", static_cast<int>(last - 1),
              failed);
  EXPECT_GE(last, 20u) << failed << " writes failed";
  EXPECT_LE(failed, 40);
  stop.Notify();
  lead.join();
  EXPECT_EQ(why, "stopped") << "the leadership was lost with one member of three down";
}

}  // namespace
}  // namespace pscluster::scheduler
