// Elastic servers (elastic.cc): ScaleJob, DrainServer and UndrainServer driven through the
// Scheduler on a fake clock with stand-in servers and workers (testing/scheduler_fixture.h).
#include <map>

#include "absl/strings/str_replace.h"
#include "scheduler/testing/scheduler_fixture.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::scheduler::testing::kJob;
using ::pscluster::scheduler::testing::SchedulerTest;
using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::StartsWith;

class ElasticTest : public SchedulerTest {
 protected:
  // Every stand-in server reports the live copies it is given as caught up at once.
  void CopiesCatchUp() {
    for (const std::string& id : ids_) {
      if (Node(id)->server() != nullptr) Node(id)->server()->SetAllCopiesCaughtUp(true);
    }
  }
  absl::Status Scale(const std::string& id, uint32_t servers, v1::ScaleJobResponse* resp = nullptr) {
    v1::ScaleJobRequest req;
    req.set_job_id(id);
    req.set_servers(servers);
    v1::ScaleJobResponse r;
    absl::Status s = sched_->ScaleJob(req, &r);
    if (resp != nullptr) *resp = r;
    return s;
  }
  absl::Status Drain(const std::string& node, v1::DrainServerResponse* resp = nullptr) {
    v1::DrainServerRequest req;
    req.set_node_id(node);
    v1::DrainServerResponse r;
    absl::Status s = sched_->DrainServer(req, &r);
    if (resp != nullptr) *resp = r;
    return s;
  }
  // Runs the moves thread's passes until no change of `jobs` is under way (at most 100).
  void Settle(const std::vector<std::string>& jobs) {
    for (int i = 0; i < 100; ++i) {
      sched_->RunMoves();
      bool active = false;
      for (const std::string& id : jobs) active = active || Get(id).elastic().active();
      if (!active) {
        sched_->RunMoves();  // Marks drained servers.
        return;
      }
    }
    FAIL() << "the change did not end";
  }
  static std::map<std::string, int> Primaries(const v1::ShardMap& map) {
    std::map<std::string, int> n;
    for (const v1::ServerEndpoint& ep : map.servers()) n[ep.node_id()] = 0;
    for (const v1::ShardAssignment& a : map.assignments()) ++n[a.primary()];
    return n;
  }
  v1::NodeDrain DrainOf(const std::string& node) { return sched_->registry().Get(node)->drain(); }
  std::vector<std::string> servers_;  // Node ids of the stand-in servers, in order.
  void AddServers(int n) {
    for (int i = 0; i < n; ++i) servers_.push_back(AddNode(v1::ROLE_SERVER));
  }
  void AddWorkers(int n) {
    for (int i = 0; i < n; ++i) AddNode(v1::ROLE_WORKER);
  }
};

// 2 -> 3: the third server gets the job's map with a live copy, then the job's tables as its
// primary declared them, then shards until each server holds its share; no task is touched.
TEST_F(ElasticTest, ScaleOutGivesANewServerTheTablesAndItsShareOfShards) {
  AddServers(3);
  AddWorkers(2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &id));
  CopiesCatchUp();
  const v1::ShardMap before = MapOf(id);
  ASSERT_EQ(before.servers_size(), 2);
  std::string fresh;
  for (const std::string& s : servers_) {
    if (Primaries(before).count(s) == 0) fresh = s;
  }
  v1::ScaleJobResponse resp;
  ASSERT_THAT(Scale(id, 3, &resp), IsOk());
  EXPECT_THAT(resp.change().servers(), Contains(fresh));
  EXPECT_TRUE(resp.change().active());
  ASSERT_NO_FATAL_FAILURE(Settle({id}));

  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_RUNNING);
  EXPECT_THAT(job.elastic().result(), StartsWith("done: 3 server(s)"));
  EXPECT_THAT(job.servers(), SizeIs(3));
  const v1::ShardMap after = MapOf(id);
  const std::map<std::string, int> held = Primaries(after);
  ASSERT_EQ(held.size(), 3u);
  const int shards = after.num_virtual_shards();
  for (const auto& [node, n] : held) {
    EXPECT_GE(n, shards / 3) << node;
    EXPECT_LE(n, shards / 3 + 1) << node;
  }
  EXPECT_EQ(job.elastic().moves_done(), static_cast<uint32_t>(held.at(fresh)));
  // The new server: one CreateTables, with the tables its first source reported.
  auto created = Node(fresh)->server()->created();
  ASSERT_THAT(created, Not(IsEmpty()));
  EXPECT_EQ(created[0].job_id(), id);
  ASSERT_EQ(created[0].tables_size(), 1);
  EXPECT_EQ(created[0].tables(0).name(), "w");
  EXPECT_EQ(created[0].num_virtual_shards(), before.num_virtual_shards());
  EXPECT_EQ(created[0].num_workers(), 2u);
  // Its first map came before its tables and named its live copy.
  auto updates = Node(fresh)->server()->updates();
  ASSERT_THAT(updates, Not(IsEmpty()));
  ASSERT_EQ(updates[0].copy_from_size(), 1);
  EXPECT_TRUE(updates[0].copy_from(0).live());
  for (const std::string& w : job.workers()) {
    EXPECT_THAT(Node(w)->worker()->stopped(), IsEmpty());
    EXPECT_THAT(Node(w)->worker()->assigned(), SizeIs(1));
  }
}

// 3 -> 2: the last server's shards move to the two that stay, then it leaves the map, and the
// job is dropped on it once the workers have had the time to fetch the map.
TEST_F(ElasticTest, ScaleInEmptiesAServerThenTakesItOutOfTheMapAndDropsTheJobThere) {
  AddServers(3);
  AddWorkers(2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(
      StartJob(absl::StrReplaceAll(kJob, {{"num_servers: 2", "num_servers: 3"}}), &id));
  CopiesCatchUp();
  const v1::ShardMap before = MapOf(id);
  ASSERT_EQ(before.servers_size(), 3);
  const std::string leaving = before.servers(2).node_id();
  ASSERT_THAT(Scale(id, 2), IsOk());
  ASSERT_NO_FATAL_FAILURE(Settle({id}));
  const v1::Job job = Get(id);
  EXPECT_THAT(job.elastic().result(), StartsWith("done: 2 server(s)")) << job.elastic().result();
  EXPECT_THAT(job.servers(), Not(Contains(leaving)));
  const v1::ShardMap after = MapOf(id);
  EXPECT_EQ(after.servers_size(), 2);
  EXPECT_EQ(Primaries(after).count(leaving), 0u);
  for (const v1::ServerEndpoint& ep : after.servers()) {
    EXPECT_EQ(Node(ep.node_id())->server()->updates().back().map().epoch(), after.epoch());
  }
  EXPECT_THAT(Node(leaving)->server()->dropped(), IsEmpty());  // Not before the grace.
  clock_.Advance(options_.task_stop_grace + absl::Seconds(1));
  BeatAll();
  sched_->RunOnce();
  EXPECT_THAT(Node(leaving)->server()->dropped(), Contains(id));
  EXPECT_EQ(job.state(), v1::JOB_RUNNING);
}

// A drain moves the shards of every job on the server off it, marks it DRAINED, and the mark
// survives a restart of the scheduler: no placement chooses it until it is undrained.
TEST_F(ElasticTest, ADrainEmptiesTheServerOfEveryJobAndTheMarkSurvivesARestart) {
  AddServers(3);
  AddWorkers(4);
  std::string a, b;
  ASSERT_NO_FATAL_FAILURE(
      StartJob(absl::StrReplaceAll(kJob, {{"num_servers: 2", "num_servers: 3"}}), &a));
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &b));
  CopiesCatchUp();
  // A server both jobs use.
  const v1::Job started = Get(b);
  const std::string node = started.servers(started.servers_size() - 1);
  v1::DrainServerResponse resp;
  ASSERT_THAT(Drain(node, &resp), IsOk());
  EXPECT_EQ(resp.drain(), v1::NODE_DRAINING);
  EXPECT_THAT(resp.jobs(), SizeIs(2));
  EXPECT_EQ(DrainOf(node), v1::NODE_DRAINING);
  ASSERT_NO_FATAL_FAILURE(Settle({a, b}));
  for (const std::string& id : {a, b}) {
    const v1::Job job = Get(id);
    EXPECT_EQ(job.state(), v1::JOB_RUNNING);
    EXPECT_THAT(job.elastic().result(), StartsWith("done")) << job.elastic().result();
    EXPECT_THAT(job.servers(), Not(Contains(node)));
    EXPECT_EQ(Primaries(MapOf(id)).count(node), 0u);
  }
  EXPECT_EQ(DrainOf(node), v1::NODE_DRAINED);

  StartScheduler();  // Restart: the mark comes back from the store.
  EXPECT_EQ(DrainOf(node), v1::NODE_DRAINED);
  BeatAll();
  // Moves onto it are refused; a new job is placed on the other servers.
  v1::MoveShardRequest mv;
  mv.set_job_id(b);
  mv.set_shard(0);
  mv.set_to(node);
  v1::MoveShardResponse moved;
  EXPECT_THAT(sched_->MoveShard(mv, &moved),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("drained")));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(a);
  v1::CancelJobResponse cancelled;
  ASSERT_THAT(sched_->CancelJob(cancel, &cancelled), IsOk());
  FinishTasks(a);
  clock_.Advance(options_.task_stop_grace + absl::Seconds(1));
  BeatAll();
  sched_->RunOnce();
  std::string c;
  auto submitted = Submit(kJob);
  ASSERT_THAT(submitted, IsOk());
  c = *submitted;
  for (int i = 0; i < 5 && Get(c).state() != v1::JOB_RUNNING; ++i) {
    clock_.Advance(absl::Seconds(1));
    BeatAll();
    sched_->RunOnce();
  }
  ASSERT_EQ(Get(c).state(), v1::JOB_RUNNING) << Get(c).reason();
  EXPECT_THAT(Get(c).servers(), Not(Contains(node)));

  v1::UndrainServerRequest un;
  un.set_node_id(node);
  v1::UndrainServerResponse back;
  ASSERT_THAT(sched_->UndrainServer(un, &back), IsOk());
  EXPECT_EQ(DrainOf(node), v1::NODE_IN_SERVICE);
}

// Jobs whose shards cannot move live (they aggregate their pushes) are refused by name, and
// nothing changes.
TEST_F(ElasticTest, JobsThatAggregateAreRefusedAndNothingChanges) {
  AddServers(3);
  AddWorkers(2);
  std::string agg;
  ASSERT_NO_FATAL_FAILURE(StartJob(
      absl::StrReplaceAll(kJob, {{"{mode: bsp}", "{mode: bsp, aggregate: true}"}}), &agg));
  EXPECT_THAT(Scale(agg, 3), StatusIs(absl::StatusCode::kFailedPrecondition,
                                      HasSubstr("consistency.aggregate")));
  const std::string node = Get(agg).servers(0);
  EXPECT_THAT(Drain(node), StatusIs(absl::StatusCode::kFailedPrecondition,
                                    HasSubstr("cannot be drained")));
  EXPECT_EQ(DrainOf(node), v1::NODE_IN_SERVICE);
  EXPECT_FALSE(Get(agg).has_elastic());
}

// A server holding primaries and backups of a replicated job is drained: each copy it holds moves
// to a server holding none of that shard, the job keeps two copies of every shard on distinct
// servers, and the server is drained. A scale below the replication factor is refused.
TEST_F(ElasticTest, ADrainMovesPrimariesAndBackupsOfAReplicatedJob) {
  AddServers(3);
  AddWorkers(2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(absl::StrCat(kJob, "replication: 2\n"), &id));
  CopiesCatchUp();
  EXPECT_THAT(Scale(id, 1), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("keeps 2 copies of every shard")));
  const v1::ShardMap before = MapOf(id);
  const std::string node = before.assignments(0).primary();
  int copies_on_node = 0;
  for (const v1::ShardAssignment& a : before.assignments()) {
    copies_on_node += (a.primary() == node) + (a.backups(0) == node);
  }
  ASSERT_EQ(copies_on_node, before.num_virtual_shards());  // Two servers: every shard on both.
  v1::DrainServerResponse resp;
  ASSERT_THAT(Drain(node, &resp), IsOk());
  EXPECT_EQ(resp.drain(), v1::NODE_DRAINING);
  ASSERT_NO_FATAL_FAILURE(Settle({id}));

  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_RUNNING);
  EXPECT_THAT(job.elastic().result(), StartsWith("done: 2 server(s)")) << job.elastic().result();
  EXPECT_EQ(job.elastic().moves_done(), static_cast<uint32_t>(copies_on_node));
  EXPECT_THAT(job.servers(), Not(Contains(node)));
  const v1::ShardMap after = MapOf(id);
  for (const v1::ShardAssignment& a : after.assignments()) {
    ASSERT_EQ(a.backups_size(), 1) << "shard " << a.shard();
    EXPECT_NE(a.primary(), a.backups(0)) << "shard " << a.shard();
    EXPECT_NE(a.primary(), node);
    EXPECT_NE(a.backups(0), node);
  }
  int backup_moves = 0;
  for (const v1::ShardMove& m : job.moves()) {
    EXPECT_EQ(m.state(), v1::MOVE_DONE) << m.result();
    EXPECT_EQ(m.from(), node);
    backup_moves += m.backup();
  }
  EXPECT_GT(backup_moves, 0);
  EXPECT_EQ(DrainOf(node), v1::NODE_DRAINED);
}

TEST_F(ElasticTest, BadRequestsNameWhatIsWrong) {
  AddServers(2);
  AddWorkers(2);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartJob(kJob, &id));
  EXPECT_THAT(Scale(id, 0), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("servers")));
  EXPECT_THAT(Scale("nope", 2), StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(Scale(id, 3), StatusIs(absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("only 0 other server(s)")));
  EXPECT_THAT(Scale(id, 100000), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("virtual shards")));
  EXPECT_THAT(Drain("server-99"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("server-99")));
  EXPECT_THAT(Drain(Get(id).workers(0)), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  HasSubstr("only servers")));
  // One change at a time.
  ASSERT_THAT(Scale(id, 1), IsOk());
  EXPECT_THAT(Scale(id, 2), StatusIs(absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("one change at a time")));
  EXPECT_FALSE(Get(id).elastic().servers().empty());
}

}  // namespace
}  // namespace pscluster::scheduler
