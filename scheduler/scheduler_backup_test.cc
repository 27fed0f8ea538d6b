// The Scheduler's backup passes (testing/scheduler_fixture.h): backups dropped when their
// primary cannot reach them, replaced on a server it reaches, promoted when a primary is lost,
// and new copies after a promotion.
#include "scheduler/testing/scheduler_fixture.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::scheduler::testing::CheckpointedJob;
using ::pscluster::scheduler::testing::FakeNode;
using ::pscluster::scheduler::testing::FakeParameterServer;
using ::pscluster::scheduler::testing::FakeWorker;
using ::pscluster::scheduler::testing::kJob;
using ::pscluster::scheduler::testing::SchedulerTest;
using ::pscluster::scheduler::testing::WriteCheckpoint;
using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// A primary that cannot deliver copies to its backup (a partition between the two servers, both
// alive) says so in its status; the scheduler drops that backup from the map, so that the
// primary's pushes go through again, and no task stops.
// With a third server, the shards that lost their backup get a new one there: a live copy that
// the primary seeds, with no task stopped; the server the primary cannot reach is never paired
// with it again.
TEST_F(SchedulerTest, ADroppedBackupIsReplacedOnAServerThePrimaryReaches) {
  AddCluster(3, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrReplaceAll(absl::StrCat(kJob, "replication: 2\n"),
                                                       {{"num_servers: 2", "num_servers: 3"}}),
                                   &id));
  v1::Job job = Get(id);
  const v1::ShardMap before = MapOf(id);
  ASSERT_EQ(before.servers_size(), 3);
  const std::string p = before.assignments(0).primary();
  ASSERT_THAT(before.assignments(0).backups(), SizeIs(1));
  const std::string b = before.assignments(0).backups(0);
  std::string c;
  for (const v1::ServerEndpoint& ep : before.servers()) {
    if (ep.node_id() != p && ep.node_id() != b) c = ep.node_id();
  }
  ASSERT_FALSE(c.empty());
  const size_t c_updates = Node(c)->server()->updates().size();
  Node(p)->server()->SetUnreachableBackups({Node(b)->address()});
  clock_.Advance(options_.status_poll_interval);
  BeatAll();
  sched_->RunOnce();  // The poll sees it.
  sched_->RunOnce();  // The control pass drops b and gives p's shards a new backup.

  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  const v1::ShardMap after = MapOf(id);
  EXPECT_EQ(after.epoch(), before.epoch() + 2) << "one map drops, one adds";
  EXPECT_EQ(job.shard_map_epoch(), after.epoch());
  for (const v1::ShardAssignment& a : after.assignments()) {
    EXPECT_EQ(a.primary(), before.assignments(a.shard()).primary());
    ASSERT_THAT(a.backups(), SizeIs(1)) << "shard " << a.shard();
    if (a.primary() == p) {
      EXPECT_EQ(a.backups(0), c) << "shard " << a.shard();
    } else {
      EXPECT_EQ(a.backups(0), before.assignments(a.shard()).backups(0)) << "shard " << a.shard();
    }
  }
  // c takes the map with a live seed from p; every server learns to seed its new backups.
  auto updates = Node(c)->server()->updates();
  ASSERT_GT(updates.size(), c_updates);
  const v1::UpdateShardMapRequest& to_c = updates.back();
  EXPECT_EQ(to_c.map().epoch(), after.epoch());
  ASSERT_EQ(to_c.copy_from_size(), 1);
  EXPECT_EQ(to_c.copy_from(0).primary(), p);
  EXPECT_TRUE(to_c.copy_from(0).live());
  for (const std::string& s : {p, b, c}) {
    const v1::UpdateShardMapRequest u = Node(s)->server()->updates().back();
    EXPECT_EQ(u.map().epoch(), after.epoch()) << s;
    EXPECT_TRUE(u.seed_new_backups()) << s;
    EXPECT_EQ(u.min_attempt(), 0u) << "no task is fenced";
    if (s != c) {
      EXPECT_THAT(u.copy_from(), IsEmpty()) << s;
    }
  }
  for (const std::string& w : job.workers()) EXPECT_THAT(Node(w)->worker()->stopped(), IsEmpty());
  EXPECT_EQ(job.recovery().recoveries(), 0u);
  EXPECT_THAT(sched_->RenderMetrics(), HasSubstr("pscluster_scheduler_backups_replaced_total 1"));
  // Nothing more to do: no new map.
  clock_.Advance(options_.status_poll_interval);
  BeatAll();
  sched_->RunOnce();
  sched_->RunOnce();
  EXPECT_EQ(MapOf(id).epoch(), after.epoch());
  ASSERT_EQ(job.recovery().cut_backups_size(), 1);
  EXPECT_EQ(job.recovery().cut_backups(0).primary(), p);
  EXPECT_EQ(job.recovery().cut_backups(0).backup(), b);
}

// With two servers there is no other server: the shards go on with a copy fewer, and the
// server the primary was cut from is not given back to it, not even by a restarted scheduler.
TEST_F(SchedulerTest, ACutBackupIsNotGivenBackAfterARestart) {
  AddCluster(2, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrCat(kJob, "replication: 2\n"), &id));
  const v1::ShardMap before = MapOf(id);
  const std::string p = before.assignments(0).primary();
  const std::string b = before.assignments(0).backups(0);
  Node(p)->server()->SetUnreachableBackups({Node(b)->address()});
  clock_.Advance(options_.status_poll_interval);
  BeatAll();
  sched_->RunOnce();
  sched_->RunOnce();
  Node(p)->server()->SetUnreachableBackups({});
  const uint64_t dropped = MapOf(id).epoch();
  EXPECT_EQ(dropped, before.epoch() + 1);
  StartScheduler();
  clock_.Advance(options_.startup_grace + options_.status_poll_interval);
  BeatAll();
  for (int i = 0; i < 3; ++i) sched_->RunOnce();
  EXPECT_EQ(Get(id).state(), v1::JOB_RUNNING);
  EXPECT_EQ(MapOf(id).epoch(), dropped) << "no map gives b back to p";
  const v1::ShardMap now = MapOf(id);
  for (const v1::ShardAssignment& a : now.assignments()) {
    if (a.primary() == p) {
      EXPECT_THAT(a.backups(), IsEmpty()) << "shard " << a.shard();
    }
  }
}

TEST_F(SchedulerTest, ABackupItsPrimaryCannotReachIsDroppedFromTheMap) {
  AddCluster(2, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrCat(kJob, "replication: 2\n"), &id));
  v1::Job job = Get(id);
  const v1::ShardMap before = MapOf(id);
  const std::string p = job.servers(0), b = job.servers(1);
  size_t of_p = 0;
  for (const v1::ShardAssignment& a : before.assignments()) {
    ASSERT_THAT(a.backups(), SizeIs(1));
    of_p += a.primary() == p ? 1 : 0;
  }
  ASSERT_GT(of_p, 0u);
  Node(p)->server()->SetUnreachableBackups({Node(b)->address()});
  clock_.Advance(options_.status_poll_interval);
  BeatAll();
  sched_->RunOnce();  // The poll sees it.
  sched_->RunOnce();  // The control pass acts on it.

  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  const v1::ShardMap after = MapOf(id);
  EXPECT_EQ(after.epoch(), before.epoch() + 1);
  EXPECT_EQ(job.shard_map_epoch(), after.epoch());
  for (const v1::ShardAssignment& a : after.assignments()) {
    EXPECT_EQ(a.primary(), before.assignments(a.shard()).primary());
    if (a.primary() == p) {
      EXPECT_THAT(a.backups(), IsEmpty()) << "shard " << a.shard();
    } else {
      EXPECT_THAT(a.backups(), ElementsAre(p)) << "shard " << a.shard();
    }
  }
  for (const std::string& s : {p, b}) {
    const v1::UpdateShardMapRequest u = Node(s)->server()->updates().back();
    EXPECT_EQ(u.map().epoch(), after.epoch()) << s;
    EXPECT_EQ(u.min_attempt(), 0u) << "no task is fenced";
  }
  for (const std::string& w : job.workers()) EXPECT_THAT(Node(w)->worker()->stopped(), IsEmpty());
  EXPECT_EQ(job.recovery().recoveries(), 0u);
  // Reported again (the status lags): nothing more to drop, no new map.
  clock_.Advance(options_.status_poll_interval);
  BeatAll();
  sched_->RunOnce();
  sched_->RunOnce();
  EXPECT_EQ(MapOf(id).epoch(), after.epoch());
}

// replication: 2: every shard has a backup on the other server. When one server is lost, its
// shards' backups take over: no rollback, no DropJob, no checkpoint files; every rank resumes on
// its worker at its lowest clock on the servers, fenced at a new attempt.
TEST_F(SchedulerTest, ALostServersBackupsTakeOverWithNoRollback) {
  AddCluster(2, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrCat(kJob, "replication: 2\n"), &id));
  v1::Job job = Get(id);
  v1::ShardMap map = MapOf(id);
  for (const auto& a : map.assignments()) ASSERT_THAT(a.backups(), SizeIs(1));
  const std::string lost = job.servers(0), kept = job.servers(1);
  // The survivor: rank 0 finished step 12, rank 1 is half-way through step 12.
  Node(kept)->server()->SetClocks({12, 11});
  const std::vector<std::string> workers(job.workers().begin(), job.workers().end());
  Leave(lost);
  EXPECT_EQ(Get(id).state(), v1::JOB_RECOVERING);
  sched_->RunOnce();

  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  EXPECT_EQ(job.recovery().promotions(), 1u);
  EXPECT_EQ(job.recovery().recoveries(), 0u);
  EXPECT_EQ(job.recovery().handovers(), 0u);
  EXPECT_EQ(job.progress().rolled_back_to_step(), -1);
  EXPECT_THAT(job.reason(), HasSubstr("its shards' backups took over"));
  EXPECT_THAT(job.recovery().last_cause(), HasSubstr(absl::StrCat("server holding shards ", lost)));
  EXPECT_THAT(job.servers(), ElementsAre(kept));
  EXPECT_THAT(std::vector<std::string>(job.workers().begin(), job.workers().end()),
              ::testing::ElementsAreArray(workers));
  // The survivor got the map that makes it primary of everything, and kept the job.
  const v1::ShardMap next = MapOf(id);
  EXPECT_EQ(next.epoch(), map.epoch() + 1);
  for (const auto& a : next.assignments()) {
    EXPECT_EQ(a.primary(), kept);
    EXPECT_THAT(a.backups(), IsEmpty());
  }
  EXPECT_THAT(Node(kept)->server()->dropped(), IsEmpty());
  const v1::UpdateShardMapRequest u = Node(kept)->server()->updates().back();
  EXPECT_EQ(u.map().epoch(), next.epoch());
  EXPECT_EQ(u.self(), kept);
  EXPECT_THAT(u.restore_from(), IsEmpty());
  EXPECT_EQ(u.restore_step(), 0);
  EXPECT_EQ(u.min_attempt(), 1u);
  // Each worker's task was stopped, then given again from the rank's lowest clock.
  for (int rank = 0; rank < 2; ++rank) {
    FakeWorker* w = Node(workers[rank])->worker();
    EXPECT_THAT(w->stopped(), SizeIs(1));
    auto assigned = w->assigned();
    ASSERT_THAT(assigned, SizeIs(2));
    EXPECT_EQ(assigned[1].rank(), static_cast<uint32_t>(rank));
    EXPECT_EQ(assigned[1].start_step(), rank == 0 ? 12 : 11);
    EXPECT_EQ(assigned[1].attempt(), 1u);
    EXPECT_EQ(assigned[1].shard_map().epoch(), next.epoch());
  }
  auto cancel = Report(id, 1, 13, false, "", "", 1);
  ASSERT_THAT(cancel, IsOk());
  EXPECT_FALSE(*cancel);
  EXPECT_TRUE(*Report(id, 1, 13, false, "", "", 0)) << "the old attempt is moot";
  EXPECT_THAT(sched_->RenderMetrics(), HasSubstr("pscluster_scheduler_backup_promotions_total 1"));
}

// With three servers, the shards that lost a copy with the dead server get a new backup on a
// survivor: a live copy that their primary seeds (no checkpoint_dir needed).
class PromotionTest : public SchedulerTest {
 protected:
  // A job with `replication` copies on three servers runs; its first server is lost and its
  // backups take over. *map: the map before; *lost: that server.
  void LoseAServer(int replication, std::string* id, v1::ShardMap* map, std::string* lost) {
    AddCluster(3, 2);
    auto submitted = Submit(absl::StrCat(
        absl::StrReplaceAll(kJob, {{"num_servers: 2", "num_servers: 3"}}), "replication: ",
        replication, "\n"));
    ASSERT_THAT(submitted, IsOk());
    *id = *submitted;
    sched_->RunOnce();
    v1::Job job = Get(*id);
    ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
    *map = MapOf(*id);
    *lost = job.servers(0);
    for (const std::string& s : job.servers()) Node(s)->server()->SetClocks({7, 7});
    Leave(*lost);
    sched_->RunOnce();
    job = Get(*id);
    ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
    EXPECT_EQ(job.recovery().promotions(), 1u);
    EXPECT_EQ(job.recovery().recoveries(), 0u);
  }
};

TEST_F(PromotionTest, AfterAPromotionTheShardsThatLostACopyGetANewOne) {
  std::string id, lost;
  v1::ShardMap map;
  ASSERT_NO_FATAL_FAILURE(LoseAServer(2, &id, &map, &lost));
  v1::Job job = Get(id);
  const v1::ShardMap now = MapOf(id);
  EXPECT_EQ(now.epoch(), map.epoch() + 2) << "promoted, then the new copies";
  for (const auto& a : now.assignments()) {
    EXPECT_NE(a.primary(), lost);
    ASSERT_THAT(a.backups(), SizeIs(1)) << "shard " << a.shard();
    EXPECT_NE(a.backups(0), a.primary());
    EXPECT_NE(a.backups(0), lost);
  }
  // Every survivor that backs up shards it did not back up before takes a live copy of them,
  // and every primary is asked to seed its new backups: no checkpoint file is involved.
  int seeds = 0;
  for (const std::string& s : job.servers()) {
    const v1::UpdateShardMapRequest u = Node(s)->server()->updates().back();
    EXPECT_EQ(u.map().epoch(), now.epoch());
    EXPECT_TRUE(u.seed_new_backups());
    for (const v1::ReplicaSeed& seed : u.copy_from()) {
      ++seeds;
      EXPECT_NE(seed.primary(), s);
      EXPECT_TRUE(seed.live());
      EXPECT_THAT(seed.path(), IsEmpty());
    }
    EXPECT_THAT(Node(s)->server()->checkpoints(), IsEmpty());
  }
  EXPECT_GE(seeds, 1);
  // The tasks got the final map.
  for (const std::string& w : job.workers()) {
    EXPECT_EQ(Node(w)->worker()->assigned().back().shard_map().epoch(), now.epoch());
  }
}

// replication: 3 on three servers: a lost primary's first backup takes over and its second stays
// a backup, under the new primary: it copies that primary afresh (a live copy the promoted
// server seeds), since what it held came from the lost one.
TEST_F(PromotionTest, WithThreeCopiesThePromotedPrimarysOtherBackupCopiesItAfresh) {
  std::string id, lost;
  v1::ShardMap map;
  ASSERT_NO_FATAL_FAILURE(LoseAServer(3, &id, &map, &lost));
  const v1::ShardMap now = MapOf(id);
  int copies = 0;
  for (const auto& a : now.assignments()) {
    ASSERT_THAT(a.backups(), SizeIs(1)) << "shard " << a.shard();
    const v1::ShardAssignment& was = map.assignments(static_cast<int>(a.shard()));
    if (was.primary() != lost) continue;
    // The second backup of the lost server's shard, now under the first.
    const std::string& other = a.backups(0);
    const v1::UpdateShardMapRequest u = Node(other)->server()->updates().back();
    EXPECT_EQ(u.map().epoch(), map.epoch() + 1);
    bool copies_new_primary = false;
    for (const v1::ReplicaSeed& seed : u.copy_from()) {
      copies_new_primary = copies_new_primary || (seed.primary() == a.primary() && seed.live());
    }
    EXPECT_TRUE(copies_new_primary) << other << " backs shard " << a.shard() << " under "
                                    << a.primary();
    EXPECT_TRUE(Node(a.primary())->server()->updates().back().seed_new_backups());
    ++copies;
  }
  EXPECT_GE(copies, 1);
}

// Without a live copy of every shard the lost server was primary of, the job rolls back.
TEST_F(SchedulerTest, WithoutALiveBackupALostServersJobRollsBack) {
  AddCluster(3, 2);
  auto id = Submit(absl::StrReplaceAll(absl::StrCat(kJob, "replication: 2\n"),
                                       {{"num_servers: 2", "num_servers: 3"}}));
  ASSERT_THAT(id, IsOk());
  sched_->RunOnce();
  v1::Job job = Get(*id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  // Two of its three servers go at once: some shard had its primary and its backup on them.
  for (int i = 0; i < 2; ++i) {
    Leave(job.servers(i));
  }
  sched_->RunOnce();
  job = Get(*id);
  EXPECT_EQ(job.recovery().promotions(), 0u);
  EXPECT_EQ(job.recovery().recoveries(), 1u);
}

TEST_F(SchedulerTest, AServerThatComesBackAfterItsJobMovedAwayDropsItsCopy) {
  AddCluster(3, 2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &id));
  v1::Job job = Get(id);
  const std::string away = job.servers(0);
  size_t index = 0;
  while (ids_[index] != away) ++index;
  // It stops answering (paused): its lease lapses and the job moves to the spare server.
  AdvanceWithout(away, absl::Seconds(6));
  AdvanceWithout(away, absl::Seconds(6));
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
  ASSERT_THAT(job.servers(), ::testing::Not(::testing::Contains(away)));
  EXPECT_THAT(Node(away)->server()->dropped(), IsEmpty());  // It was not reachable then.
  std::map<std::string, size_t> drops;
  for (const std::string& s : job.servers()) drops[s] = Node(s)->server()->dropped().size();

  // The same process comes back and registers again: the copy it may hold is dropped, and
  // nothing is dropped where the job runs now.
  v1::RegisterNodeRequest req;
  req.mutable_node()->set_role(v1::ROLE_SERVER);
  req.mutable_node()->set_address(Node(away)->address());
  req.mutable_node()->set_pid(1000 + index);
  v1::RegisterNodeResponse resp;
  ASSERT_THAT(sched_->RegisterNode(req, &resp), IsOk());
  ASSERT_EQ(resp.node_id(), away);
  sched_->RunOnce();
  EXPECT_THAT(Node(away)->server()->dropped(), ElementsAre(id));
  for (const std::string& s : job.servers()) {
    EXPECT_EQ(Node(s)->server()->dropped().size(), drops[s]) << s;
  }
  EXPECT_EQ(Get(id).state(), v1::JOB_RUNNING);
}

}  // namespace
}  // namespace pscluster::scheduler
