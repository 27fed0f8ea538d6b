// Live shard moves and the rebalancer, driven through the Scheduler (testing/scheduler_fixture.h).
#include "scheduler/testing/scheduler_fixture.h"

#include "absl/strings/str_replace.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::scheduler::testing::kJob;
using ::pscluster::scheduler::testing::SchedulerTest;
using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// A shard of server A's moves to B: the map that gives B a live copy (B first, asked to wait for
// A's snapshot; A asked to send it), then, once B's copy has caught up, the map that makes B the
// primary (A first). The workers are not touched.
class ShardMoveTest : public SchedulerTest {
 protected:
  // A running job; *from is a server holding *shard, *to the other server.
  void Start(std::string* id, uint32_t* shard, std::string* from, std::string* to,
             const std::string& yaml = kJob) {
    AddCluster(2, 2);
    auto submitted = Submit(yaml);
    ASSERT_THAT(submitted, IsOk());
    *id = *submitted;
    sched_->RunOnce();
    v1::Job job = Get(*id);
    ASSERT_EQ(job.state(), v1::JOB_RUNNING) << job.reason();
    const v1::ShardMap map = MapOf(*id);
    *shard = map.assignments(3).shard();
    *from = map.assignments(3).primary();
    *to = *from == job.servers(0) ? job.servers(1) : job.servers(0);
  }
  absl::Status Move(const std::string& id, uint32_t shard, const std::string& to,
                    v1::ShardMove* queued = nullptr) {
    v1::MoveShardRequest req;
    req.set_job_id(id);
    req.set_shard(shard);
    req.set_to(to);
    v1::MoveShardResponse resp;
    absl::Status s = sched_->MoveShard(req, &resp);
    if (queued != nullptr) *queued = resp.move();
    return s;
  }
  // `from` reports, in a heartbeat, job `id`'s shard `hot` at 6 MB/s and two more of the shards
  // it is primary of in `map` at 1 MB/s; nothing else carries load.
  void ReportHotShard(const std::string& id, const v1::ShardMap& map, const std::string& from,
                      uint32_t hot) {
    std::vector<std::pair<uint32_t, double>> loads = {{hot, 6e6}};
    for (const auto& a : map.assignments()) {
      if (a.primary() == from && a.shard() != hot && loads.size() < 3) {
        loads.push_back({a.shard(), 1e6});
      }
    }
    ASSERT_THAT(loads, SizeIs(3));
    v1::HeartbeatRequest hb;
    hb.set_node_id(from);
    for (auto [shard, bytes] : loads) {
      v1::ShardLoad* l = hb.add_shard_loads();
      l->set_job_id(id);
      l->set_shard(shard);
      l->mutable_load()->set_bytes_per_sec(bytes);
    }
    v1::HeartbeatResponse resp;
    ASSERT_THAT(sched_->Heartbeat(hb, &resp), IsOk());
  }
};

TEST_F(ShardMoveTest, AShardMovesToAnotherServerWithTwoMapsAndNoTaskStops) {
  std::string id, from, to;
  uint32_t shard = 0;
  Start(&id, &shard, &from, &to);
  const v1::ShardMap before = MapOf(id);
  const v1::Job started = Get(id);
  const std::vector<std::string> workers(started.workers().begin(), started.workers().end());
  Node(to)->server()->SetCopyOf(from, true);
  v1::ShardMove queued;
  ASSERT_THAT(Move(id, shard, to, &queued), IsOk());
  EXPECT_EQ(queued.state(), v1::MOVE_QUEUED);
  EXPECT_EQ(queued.from(), from);
  EXPECT_EQ(queued.reason(), "requested by psctl");
  sched_->RunMoves();

  v1::Job job = Get(id);
  ASSERT_EQ(job.moves_size(), 1);
  const v1::ShardMove& m = job.moves(0);
  EXPECT_EQ(m.state(), v1::MOVE_DONE) << m.result();
  EXPECT_EQ(m.epoch(), before.epoch() + 2);
  EXPECT_THAT(m.result(), HasSubstr("copied in"));
  EXPECT_EQ(job.shard_moves(), 1u);
  EXPECT_EQ(job.state(), v1::JOB_RUNNING);
  const v1::ShardMap after = MapOf(id);
  EXPECT_EQ(after.epoch(), before.epoch() + 2);
  for (int i = 0; i < after.assignments_size(); ++i) {
    const v1::ShardAssignment& a = after.assignments(i);
    EXPECT_EQ(a.primary(), a.shard() == shard ? to : before.assignments(i).primary());
    EXPECT_THAT(a.backups(), IsEmpty());
  }
  // The target: a live copy of the primary's shard, then the map that hands it over.
  auto updates = Node(to)->server()->updates();
  ASSERT_EQ(updates.size(), 3u);
  const v1::UpdateShardMapRequest& copy = updates[updates.size() - 2];
  EXPECT_EQ(copy.map().epoch(), before.epoch() + 1);
  ASSERT_EQ(copy.copy_from_size(), 1);
  EXPECT_EQ(copy.copy_from(0).primary(), from);
  EXPECT_TRUE(copy.copy_from(0).live());
  EXPECT_FALSE(copy.seed_new_backups());
  EXPECT_THAT(copy.map().assignments(static_cast<int>(shard)).backups(), ElementsAre(to));
  EXPECT_EQ(updates.back().map().epoch(), before.epoch() + 2);
  // The primary: asked (once) to snapshot for its new backup, then to let the shard go.
  updates = Node(from)->server()->updates();
  ASSERT_EQ(updates.size(), 3u);
  EXPECT_TRUE(updates[updates.size() - 2].seed_new_backups());
  EXPECT_THAT(updates[updates.size() - 2].copy_from(), IsEmpty());
  EXPECT_EQ(updates.back().map().epoch(), before.epoch() + 2);
  // No task was stopped or assigned again.
  for (const std::string& w : workers) {
    EXPECT_THAT(Node(w)->worker()->stopped(), IsEmpty());
    EXPECT_THAT(Node(w)->worker()->assigned(), SizeIs(1));
  }
  EXPECT_THAT(sched_->RenderMetrics(), HasSubstr("pscluster_scheduler_shard_moves_total 1"));
}

TEST_F(ShardMoveTest, ACopyThatDoesNotCatchUpIsDroppedAndTheShardStays) {
  // The wait is on the scheduler's clock: here fake time, which the wait itself moves on.
  options_.move_copy_timeout = absl::Seconds(5);
  StartScheduler();
  std::string id, from, to;
  uint32_t shard = 0;
  Start(&id, &shard, &from, &to);
  const v1::ShardMap before = MapOf(id);
  Node(to)->server()->SetCopyOf(from, false);
  ASSERT_THAT(Move(id, shard, to), IsOk());
  const absl::Time t0 = clock_.Now();
  sched_->RunMoves();
  EXPECT_GE(clock_.Now() - t0, absl::Seconds(5));  // It waited out the timeout, in fake time.
  v1::Job job = Get(id);
  ASSERT_EQ(job.moves_size(), 1);
  EXPECT_EQ(job.moves(0).state(), v1::MOVE_FAILED);
  EXPECT_THAT(job.moves(0).result(), HasSubstr(absl::StrCat("the copy on ", to,
                                                           " did not catch up within")));
  EXPECT_EQ(job.shard_moves(), 0u);
  EXPECT_EQ(job.state(), v1::JOB_RUNNING);
  // A map without the copy, the shard where it was.
  const v1::ShardMap after = MapOf(id);
  EXPECT_EQ(after.epoch(), before.epoch() + 2);
  EXPECT_EQ(after.assignments(static_cast<int>(shard)).primary(), from);
  EXPECT_THAT(after.assignments(static_cast<int>(shard)).backups(), IsEmpty());
  EXPECT_EQ(Node(to)->server()->updates().back().map().epoch(), after.epoch());
  EXPECT_THAT(sched_->RenderMetrics(),
              HasSubstr("pscluster_scheduler_shard_moves_failed_total 1"));
}

// A scheduler stopped while a copy catches up resumes the move at its next start, from the
// saved map (the servers kept the copy going): no second copy, the same move done.
TEST_F(ShardMoveTest, AMoveUnderWayWhenTheSchedulerStopsResumesAtItsNextStart) {
  std::string id, from, to;
  uint32_t shard = 0;
  Start(&id, &shard, &from, &to);
  const v1::ShardMap before = MapOf(id);
  Node(to)->server()->SetCopyOf(from, false);
  ASSERT_THAT(Move(id, shard, to), IsOk());
  std::thread mover([&] { sched_->RunMoves(); });
  for (int i = 0; i < 500 && Node(from)->server()->updates().back().map().epoch() !=
                                 before.epoch() + 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(Node(from)->server()->updates().back().map().epoch(), before.epoch() + 1);
  sched_->Stop();
  mover.join();
  EXPECT_EQ(Get(id).moves(0).state(), v1::MOVE_COPYING);
  StartScheduler();
  Node(to)->server()->SetCopyOf(from, true);
  sched_->RunMoves();
  v1::Job job = Get(id);
  ASSERT_EQ(job.moves_size(), 1);
  EXPECT_EQ(job.moves(0).state(), v1::MOVE_DONE) << job.moves(0).result();
  EXPECT_EQ(MapOf(id).epoch(), before.epoch() + 2);
  EXPECT_EQ(MapOf(id).assignments(static_cast<int>(shard)).primary(), to);
  // The copy's map went out once.
  int copies = 0;
  for (const auto& u : Node(to)->server()->updates()) copies += u.copy_from_size();
  EXPECT_EQ(copies, 1);
}

TEST_F(ShardMoveTest, MovesThatCannotBeDoneAreRefusedWithExactCodes) {
  std::string id, from, to;
  uint32_t shard = 0;
  Start(&id, &shard, &from, &to);
  EXPECT_THAT(Move("no-such-job", shard, to), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Move(id, 1000, to), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("shard: 1000 is out of range")));
  EXPECT_THAT(Move(id, shard, ""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Move(id, shard, "s-99"), StatusIs(absl::StatusCode::kNotFound,
                                                HasSubstr("to: no server 's-99'")));
  EXPECT_THAT(Move(id, shard, sched_->registry().Live(v1::ROLE_WORKER)[0].info().node_id()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("to: no server")));
  EXPECT_THAT(Move(id, shard, from), StatusIs(absl::StatusCode::kFailedPrecondition,
                                              HasSubstr("already holds shard")));
  ASSERT_THAT(Move(id, shard, to), IsOk());
  EXPECT_THAT(Move(id, shard + 1, to), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                HasSubstr("one move at a time")));
  EXPECT_EQ(Get(id).moves_size(), 1) << "refused moves change nothing";
}

// A job with replicas (replication: 2 on three servers): which copy moves, and the maps that keep
// two copies of the shard throughout.
class ReplicatedMoveTest : public ShardMoveTest {
 protected:
  void SetUp() override {
    ShardMoveTest::SetUp();
    AddCluster(3, 2);
    auto submitted = Submit(absl::StrCat(kJob, "replication: 2\n"));
    ASSERT_THAT(submitted, IsOk());
    id_ = *submitted;
    sched_->RunOnce();
    ASSERT_EQ(Get(id_).state(), v1::JOB_RUNNING) << Get(id_).reason();
    before_ = MapOf(id_);
    const v1::ShardAssignment& a = before_.assignments(3);
    shard_ = a.shard();
    primary_ = a.primary();
    ASSERT_EQ(a.backups_size(), 1);
    backup_ = a.backups(0);
    for (const v1::NodeStatus& n : sched_->registry().Live(v1::ROLE_SERVER)) {
      const std::string& s = n.info().node_id();
      if (s != primary_ && s != backup_) spare_ = s;  // Outside the job (num_servers: 2).
      Node(s)->server()->SetAllCopiesCaughtUp(true);
    }
    ASSERT_FALSE(spare_.empty());
  }
  absl::Status MoveFrom(const std::string& from, const std::string& to,
                        v1::ShardMove* queued = nullptr) {
    v1::MoveShardRequest req;
    req.set_job_id(id_);
    req.set_shard(shard_);
    req.set_to(to);
    req.set_from(from);
    v1::MoveShardResponse resp;
    absl::Status s = sched_->MoveShard(req, &resp);
    if (queued != nullptr) *queued = resp.move();
    return s;
  }
  // The last map `node` was sent at `epoch`.
  v1::UpdateShardMapRequest SentAt(const std::string& node, uint64_t epoch) {
    for (const v1::UpdateShardMapRequest& u : Node(node)->server()->updates()) {
      if (u.map().epoch() == epoch) return u;
    }
    ADD_FAILURE() << node << " was sent no map of epoch " << epoch;
    return {};
  }
  std::string id_, primary_, backup_, spare_;
  uint32_t shard_ = 0;
  v1::ShardMap before_;
};

TEST_F(ReplicatedMoveTest, ThePrimaryMovesAndTheBackupKeepsTheCopyItHolds) {
  v1::ShardMove queued;
  ASSERT_THAT(MoveFrom("", spare_, &queued), IsOk());
  EXPECT_EQ(queued.from(), primary_);
  EXPECT_FALSE(queued.backup());
  sched_->RunMoves();
  const v1::Job job = Get(id_);
  ASSERT_EQ(job.moves_size(), 1);
  EXPECT_EQ(job.moves(0).state(), v1::MOVE_DONE) << job.moves(0).result();
  EXPECT_EQ(job.state(), v1::JOB_RUNNING);
  // Map 1: three copies, the new one a live copy of the primary's.
  const uint64_t e1 = before_.epoch() + 1, e2 = before_.epoch() + 2;
  const v1::UpdateShardMapRequest copy = SentAt(spare_, e1);
  EXPECT_THAT(copy.map().assignments(static_cast<int>(shard_)).backups(),
              ElementsAre(backup_, spare_));
  ASSERT_EQ(copy.copy_from_size(), 1);
  EXPECT_EQ(copy.copy_from(0).primary(), primary_);
  EXPECT_TRUE(SentAt(primary_, e1).seed_new_backups());
  // Map 2: the target is the primary, the backup stays and keeps its copy of the shard (taken
  // from the one it held under the old primary, which hands it everything first; the new
  // primary sends it clocks, not a snapshot); the old primary holds nothing of the shard.
  const v1::ShardMap after = MapOf(id_);
  EXPECT_EQ(after.epoch(), e2);
  const v1::ShardAssignment& a = after.assignments(static_cast<int>(shard_));
  EXPECT_EQ(a.primary(), spare_);
  EXPECT_THAT(a.backups(), ElementsAre(backup_));
  const v1::UpdateShardMapRequest kept = SentAt(backup_, e2);
  ASSERT_EQ(kept.copy_from_size(), 1);
  EXPECT_EQ(kept.copy_from(0).primary(), spare_);
  EXPECT_TRUE(kept.copy_from(0).live());
  EXPECT_EQ(kept.copy_from(0).held_from(), primary_);
  EXPECT_TRUE(SentAt(spare_, e2).seed_new_backups());
  EXPECT_THAT(SentAt(spare_, e2).copy_from(), IsEmpty());
  EXPECT_THAT(SentAt(spare_, e2).backups_holding_copies(), ElementsAre(backup_));
  EXPECT_THAT(SentAt(primary_, e2).copy_from(), IsEmpty());
  EXPECT_THAT(SentAt(primary_, e2).backups_holding_copies(), ElementsAre(backup_));
  // The order that makes it safe: the old primary, then the backup, then the new primary.
  auto at = [&](const std::string& node) { return Node(node)->server()->UpdateOrder(e2); };
  EXPECT_LT(at(primary_), at(backup_));
  EXPECT_LT(at(backup_), at(spare_));
  for (int i = 0; i < after.assignments_size(); ++i) {
    if (after.assignments(i).shard() == shard_) continue;
    EXPECT_EQ(after.assignments(i).primary(), before_.assignments(i).primary());
    EXPECT_THAT(after.assignments(i).backups(),
                ElementsAre(before_.assignments(i).backups(0)));
  }
}

TEST_F(ReplicatedMoveTest, ABackupMovesAndThePrimaryStays) {
  v1::ShardMove queued;
  ASSERT_THAT(MoveFrom(backup_, spare_, &queued), IsOk());
  EXPECT_EQ(queued.from(), backup_);
  EXPECT_TRUE(queued.backup());
  sched_->RunMoves();
  const v1::Job job = Get(id_);
  ASSERT_EQ(job.moves_size(), 1);
  EXPECT_EQ(job.moves(0).state(), v1::MOVE_DONE) << job.moves(0).result();
  const uint64_t e1 = before_.epoch() + 1, e2 = before_.epoch() + 2;
  EXPECT_EQ(SentAt(spare_, e1).copy_from(0).primary(), primary_);
  const v1::ShardMap after = MapOf(id_);
  EXPECT_EQ(after.epoch(), e2);
  const v1::ShardAssignment& a = after.assignments(static_cast<int>(shard_));
  EXPECT_EQ(a.primary(), primary_);
  EXPECT_THAT(a.backups(), ElementsAre(spare_));
  // Nobody copies anew at map 2: the backup that left drops its copy, the new one has its own.
  for (const std::string& s : {primary_, backup_, spare_}) {
    EXPECT_THAT(SentAt(s, e2).copy_from(), IsEmpty()) << s;
  }
}

TEST_F(ReplicatedMoveTest, ABackupThatDoesNotCatchUpIsDroppedAndTheCopiesStay) {
  for (const std::string& s : {primary_, backup_, spare_}) {
    Node(s)->server()->SetAllCopiesCaughtUp(false);
  }
  ASSERT_THAT(MoveFrom(backup_, spare_), IsOk());
  sched_->RunMoves();
  EXPECT_EQ(Get(id_).moves(0).state(), v1::MOVE_FAILED);
  const v1::ShardMap after = MapOf(id_);
  const v1::ShardAssignment& a = after.assignments(static_cast<int>(shard_));
  EXPECT_EQ(a.primary(), primary_);
  EXPECT_THAT(a.backups(), ElementsAre(backup_));
}

TEST_F(ReplicatedMoveTest, MovesOfCopiesThatAreNotThereAreRefusedByName) {
  EXPECT_THAT(MoveFrom(spare_, primary_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("from: server '", spare_, "' holds no copy of shard"))));
  EXPECT_THAT(MoveFrom("", backup_),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(absl::StrCat("to: ", backup_, " already holds a backup of shard"))));
  EXPECT_THAT(MoveFrom(backup_, primary_),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(absl::StrCat("to: ", primary_, " already holds shard"))));
  EXPECT_THAT(Get(id_).moves(), IsEmpty());
  // A job that aggregates its pushes does not move its shards.
  AddNode(v1::ROLE_WORKER);
  AddNode(v1::ROLE_WORKER);
  auto agg = Submit(absl::StrReplaceAll(kJob, {{"{mode: bsp}", "{mode: bsp, aggregate: true}"}}));
  ASSERT_THAT(agg, IsOk());
  sched_->RunOnce();
  ASSERT_EQ(Get(*agg).state(), v1::JOB_RUNNING) << Get(*agg).reason();
  v1::MoveShardRequest req;
  req.set_job_id(*agg);
  req.set_shard(0);
  req.set_to(spare_);
  v1::MoveShardResponse resp;
  EXPECT_THAT(sched_->MoveShard(req, &resp),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("consistency.aggregate")));
}

TEST_F(ShardMoveTest, TheRebalancerMovesAHotShardOffAnOverloadedServer) {
  options_.rebalance_every = absl::Seconds(5);
  options_.rebalance.min_bytes_per_sec = 1000;
  StartScheduler();
  std::string id, from, to;
  uint32_t shard = 0;
  Start(&id, &shard, &from, &to);
  Node(to)->server()->SetCopyOf(from, true);
  sched_->RunMoves();  // The first look only starts the period.
  // `from` carries shard `shard` hot and two more of its shards lightly; `to` nothing.
  ASSERT_NO_FATAL_FAILURE(ReportHotShard(id, MapOf(id), from, shard));
  clock_.Advance(absl::Seconds(5));
  sched_->RunMoves();
  v1::Job job = Get(id);
  ASSERT_EQ(job.moves_size(), 1);
  EXPECT_EQ(job.moves(0).state(), v1::MOVE_DONE) << job.moves(0).result();
  EXPECT_EQ(job.moves(0).shard(), shard);
  EXPECT_EQ(job.moves(0).to(), to);
  EXPECT_THAT(job.moves(0).reason(), HasSubstr(absl::StrCat("rebalance: ", from, " carried")));
  EXPECT_EQ(MapOf(id).assignments(static_cast<int>(shard)).primary(), to);
}

// A job with replicas (replication: 2 over three servers): the rebalancer moves the hot shard's
// primary to the one server holding no copy of it, and the shard keeps two copies on distinct
// servers.
TEST_F(ShardMoveTest, TheRebalancerMovesAReplicatedJobsHotShardToAServerWithNoCopyOfIt) {
  options_.rebalance_every = absl::Seconds(5);
  options_.rebalance.min_bytes_per_sec = 1000;
  StartScheduler();
  AddCluster(3, 2);
  auto submitted = Submit(absl::StrReplaceAll(
      kJob, {{"num_servers: 2", "num_servers: 3\nreplication: 2"}}));
  ASSERT_THAT(submitted, IsOk());
  const std::string id = *submitted;
  sched_->RunOnce();
  ASSERT_EQ(Get(id).state(), v1::JOB_RUNNING) << Get(id).reason();
  for (const v1::NodeStatus& n : sched_->registry().Live(v1::ROLE_SERVER)) {
    Node(n.info().node_id())->server()->SetAllCopiesCaughtUp(true);
  }
  const v1::ShardMap before = MapOf(id);
  ASSERT_EQ(before.servers_size(), 3);
  const v1::ShardAssignment hot = before.assignments(3);
  ASSERT_EQ(hot.backups_size(), 1);
  std::string free;  // The server with no copy of the hot shard.
  for (const v1::ServerEndpoint& ep : before.servers()) {
    if (ep.node_id() != hot.primary() && ep.node_id() != hot.backups(0)) free = ep.node_id();
  }
  ASSERT_FALSE(free.empty());
  sched_->RunMoves();  // The first look only starts the period.
  // The hot shard's primary carries it hot and two more of its shards lightly.
  ASSERT_NO_FATAL_FAILURE(ReportHotShard(id, before, hot.primary(), hot.shard()));
  clock_.Advance(absl::Seconds(5));
  sched_->RunMoves();
  v1::Job job = Get(id);
  ASSERT_EQ(job.moves_size(), 1);
  EXPECT_EQ(job.moves(0).state(), v1::MOVE_DONE) << job.moves(0).result();
  EXPECT_EQ(job.moves(0).shard(), hot.shard());
  EXPECT_EQ(job.moves(0).to(), free) << "never to " << hot.backups(0) << ", which has a copy";
  EXPECT_THAT(job.moves(0).reason(), HasSubstr("rebalance: "));
  const v1::ShardMap after = MapOf(id);
  const v1::ShardAssignment& moved = after.assignments(static_cast<int>(hot.shard()));
  EXPECT_EQ(moved.primary(), free);
  ASSERT_EQ(moved.backups_size(), 1) << "two copies, as before";
  EXPECT_NE(moved.backups(0), free);
  EXPECT_EQ(job.state(), v1::JOB_RUNNING);
  EXPECT_EQ(job.recovery().recoveries(), 0u);
}

}  // namespace
}  // namespace pscluster::scheduler
