// A shard's primary moving while a backup keeps its copy (UpdateShardMapRequest.
// backups_holding_copies, ReplicaSeed.held_from), over three PsHandlers in this process without
// sockets: P (s0) is the moved shard's primary, B (s1) its backup, T (s2) the target. The moves
// pass's two maps are installed by hand in its order: map 1 gives T a live copy of P's shards;
// map 2 makes T the shard's primary (P first, then B, then T). B must then hold the shard under
// T without a second snapshot, and take over from T at any point with exactly the updates every
// server acknowledged: a single server given each push once (the reference) holds the same bits.
//
// Parameter `kept`: B backs T's own shards before the move too (its copy of T's shards goes on,
// growing by the moved shard), or B starts backing T with the move (a new copy).
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/wait_for.h"
#include "common/sharding.h"
#include "gtest/gtest.h"
#include "server/ps_handler.h"
#include "server/testing/in_process_backup_transport.h"
#include "server/testing/test_tables.h"

namespace pscluster::testing {
namespace {

constexpr char kJob[] = "j";
const std::vector<std::string> kAddr = {"a:0", "b:1", "c:2"};
constexpr int kP = 0, kB = 1, kT = 2;

std::string Node(int i) { return absl::StrCat("s", i); }

class MovedPrimaryCopyTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto make = [&](int i) {
      PsHandlerOptions o;
      o.checkpoint_dir = TempDir(absl::StrCat("moved_primary_copy_", i, "_", GetParam()));
      o.replication_retry = absl::Milliseconds(300);
      return std::make_unique<PsHandler>(o, &clock_, [](std::function<void()> f) { f(); });
    };
    // Each server sends through a transport of its own, so that one link can fail.
    for (int i = 0; i < 3; ++i) {
      h_[i] = make(i);
      h_[i]->set_node_id(Node(i));
      h_[i]->set_address(kAddr[i]);
      transport_[i] = std::make_shared<InProcessBackupTransport>();
      h_[i]->set_backup_transport(transport_[i]);
    }
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) transport_[i]->Add(kAddr[j], h_[j].get());
    }
    // The reference: one server holding every shard, without copies, given each push once.
    ref_ = make(3);
    ref_->set_node_id("s0");
    ref_->set_address("r:9");
    const auto create =
        CreateRequest(kJob, {DenseSpec("w", {64, 4}, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.1f),
                                       4)},
                      v1::ConsistencySpec::ASP, 1);
    // As a worker does at the start of a job: the map first, then the tables.
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(Install(i, Base(), {}).ok());
    v1::UpdateShardMapRequest ref_map;
    *ref_map.mutable_map() = RoundRobinMap(kJob, 1, {"r:9"});
    ref_map.set_self("s0");
    v1::UpdateShardMapResponse resp;
    ASSERT_TRUE(ref_->UpdateShardMap(ref_map, &resp).ok());
    for (PsHandler* h : {h_[0].get(), h_[1].get(), h_[2].get(), ref_.get()}) {
      v1::CreateTablesResponse created;
      absl::Status s = h->CreateTables(create, &created);
      ASSERT_TRUE(s.ok()) << s;
    }
    // A block of each server's shards: bx's shard is the one that moves.
    const uint64_t th = TableHash("w");
    for (uint64_t b = 0; b < 64; ++b) {
      const uint32_t shard = ShardOfBlock(th, b, 16);
      uint64_t& pick = shard % 3 == kP ? bx_ : shard % 3 == kB ? bo_ : bt_;
      if (pick == kNone) pick = b;
    }
    ASSERT_TRUE(bx_ != kNone && bo_ != kNone && bt_ != kNone);
    moved_ = ShardOfBlock(th, bx_, 16);
  }

  // Shard s's primary is s{s % 3}; P's shards are backed by B, B's by P, T's by B (kept) or P.
  v1::ShardMap Base() const {
    v1::ShardMap m = RoundRobinMap(kJob, 1, kAddr);
    for (auto& a : *m.mutable_assignments()) {
      const bool kept = GetParam();
      a.add_backups(a.primary() == Node(kB) ? Node(kP)
                    : a.primary() == Node(kP) ? Node(kB)
                                              : Node(kept ? kB : kP));
    }
    return m;
  }
  v1::ShardAssignment* Moved(v1::ShardMap& m) {
    return m.mutable_assignments(static_cast<int>(moved_));
  }
  // Map 1 of the move: T backs the moved shard with a live copy.
  v1::ShardMap Map1() {
    v1::ShardMap m = Base();
    m.set_epoch(2);
    Moved(m)->add_backups(Node(kT));
    return m;
  }
  // Map 2: T is its primary, B its backup.
  v1::ShardMap Map2() {
    v1::ShardMap m = Base();
    m.set_epoch(3);
    Moved(m)->set_primary(Node(kT));
    Moved(m)->clear_backups();
    Moved(m)->add_backups(Node(kB));
    return m;
  }
  // T lost: each of its shards promoted to its backup, T out of the map.
  v1::ShardMap Promoted() {
    v1::ShardMap m = Map2();
    m.set_epoch(4);
    for (auto& a : *m.mutable_assignments()) {
      if (a.primary() != Node(kT)) continue;
      a.set_primary(a.backups(0));
      a.clear_backups();
    }
    m.mutable_servers()->DeleteSubrange(kT, 1);
    return m;
  }

  absl::Status Install(int i, const v1::ShardMap& map,
                       const std::function<void(v1::UpdateShardMapRequest*)>& extra) {
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = map;
    req.set_self(Node(i));
    if (extra) extra(&req);
    v1::UpdateShardMapResponse resp;
    return h_[i]->UpdateShardMap(req, &resp);
  }
  // The moves pass's map 1, in its order: the target, the primary, the rest.
  void MoveMap1() {
    ASSERT_TRUE(Install(kT, Map1(), [](v1::UpdateShardMapRequest* r) {
                  v1::ReplicaSeed* seed = r->add_copy_from();
                  seed->set_primary(Node(kP));
                  seed->set_live(true);
                }).ok());
    ASSERT_TRUE(
        Install(kP, Map1(), [](v1::UpdateShardMapRequest* r) { r->set_seed_new_backups(true); })
            .ok());
    ASSERT_TRUE(Install(kB, Map1(), {}).ok());
  }
  // Map 2 to one server as the moves pass sends it.
  absl::Status MoveMap2(int i) {
    return Install(i, Map2(), [i](v1::UpdateShardMapRequest* r) {
      r->set_seed_new_backups(true);
      if (i == kB) {
        v1::ReplicaSeed* seed = r->add_copy_from();
        seed->set_primary(Node(kT));
        seed->set_live(true);
        seed->set_held_from(Node(kP));
      }
      if (i != kB) r->add_backups_holding_copies(Node(kB));
    });
  }

  // Worker 0 pushes `block`'s gradient for `step` to `server` (at map `epoch`); the reference
  // gets it too unless `resent` (a chunk some server applied before).
  absl::StatusOr<PushResult> Push(int server, uint64_t block, int64_t step, uint64_t epoch,
                                  bool eos, bool resent = false) {
    v1::PushChunk c;
    c.mutable_tag()->set_job_id(kJob);
    c.mutable_tag()->set_worker(0);
    c.mutable_tag()->set_step(step);
    c.set_epoch(epoch);
    c.set_dtype(v1::DT_FLOAT32);
    c.mutable_slice()->set_table("w");
    c.mutable_slice()->set_block(block);
    c.set_end_of_step(eos);
    c.set_last(true);
    std::vector<float> g(4);
    for (int i = 0; i < 4; ++i) g[i] = 0.25f * static_cast<float>(step + 1) + 0.01f * block + i;
    const Payload values = Payload::FromString(
        std::string(reinterpret_cast<const char*>(g.data()), g.size() * 4));
    if (!resent) {
      // Its clock ends a step once all of the step is in (RefEndStep): no two servers' rounds.
      v1::PushChunk r = c;
      r.set_epoch(1);
      r.set_end_of_step(false);
      auto applied = ref_->Push(r, values);
      EXPECT_TRUE(applied.ok() && !applied->duplicate) << applied.status();
    }
    return h_[server]->Push(c, values);
  }
  // One whole step of each block at its primary under `epoch` (bx at `x_at`, bt at `t_at`).
  // Each server of the round then ends the step (a round ends once on each server).
  void Step(int64_t step, uint64_t epoch, int x_at, int t_at) {
    auto a = Push(x_at, bx_, step, epoch, false);
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = Push(t_at, bt_, step, epoch, false);
    ASSERT_TRUE(b.ok()) << b.status();
    auto c = Push(kB, bo_, step, epoch, false);
    ASSERT_TRUE(c.ok()) << c.status();
    for (int i = 0; i < 3; ++i) {
      if (i == x_at || i == t_at || i == kB) EndStep(i, step, epoch);
    }
    RefEndStep(step);
  }
  void RefEndStep(int64_t step) {
    v1::PushChunk c;
    c.mutable_tag()->set_job_id(kJob);
    c.mutable_tag()->set_step(step);
    c.set_epoch(1);
    c.set_end_of_step(true);
    c.set_last(true);
    auto ended = ref_->Push(c, Payload());
    ASSERT_TRUE(ended.ok()) << ended.status();
  }

  std::vector<float> Read(PsHandler& h, uint64_t block, uint64_t epoch) {
    v1::PullRequest req;
    req.set_job_id(kJob);
    req.set_worker(0);
    req.set_epoch(epoch);
    req.set_dtype(v1::DT_FLOAT32);
    v1::Slice* s = req.add_slices();
    s->set_table("w");
    s->set_block(block);
    auto plan = h.PlanPull(req);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return {};
    std::vector<float> out(plan->slices[0].elems);
    absl::Status st = plan->job->Read(plan->slices[0], epoch, 0, out.size(), v1::DT_FLOAT32,
                                      reinterpret_cast<char*>(out.data()));
    EXPECT_TRUE(st.ok()) << st;
    return out;
  }
  // Each block at `server` (its primary under `epoch`) holds the reference's bits.
  void ExpectAsReference(const std::vector<std::pair<uint64_t, int>>& blocks, uint64_t epoch) {
    for (const auto& [block, server] : blocks) {
      std::vector<float> got = Read(*h_[server], block, epoch);
      std::vector<float> want = Read(*ref_, block, 1);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
          << "block " << block << " on s" << server << ": " << got[0] << " != " << want[0];
    }
  }
  std::optional<v1::ReplicaOnServer> Replica(int server, const std::string& primary) {
    v1::ServerStatusRequest req;
    req.set_job_id(kJob);
    v1::ServerStatus st;
    EXPECT_TRUE(h_[server]->Status(req, &st).ok());
    for (const auto& r : st.jobs(0).replicas()) {
      if (r.primary() == primary) return r;
    }
    return std::nullopt;
  }

  // Steps 0-2 under the base map, map 1, step 3 on it (T's copy catches up), and a chunk of
  // step 4 that T applies to its own shard before the switch.
  void UpToTheSwitch() {
    for (int64_t step = 0; step < 3; ++step) Step(step, 1, kP, kT);
    MoveMap1();
    Step(3, 2, kP, kT);
    auto copy = Replica(kT, Node(kP));
    ASSERT_TRUE(copy.has_value());
    ASSERT_TRUE(copy->caught_up()) << "T's live copy of P's shards";
    auto early = Push(kT, bt_, 4, 2, false);
    ASSERT_TRUE(early.ok() && early->applied) << early.status();
  }

  // A chunk that only ends worker 0's `step` on `server`.
  void EndStep(int server, int64_t step, uint64_t epoch) {
    v1::PushChunk c;
    c.mutable_tag()->set_job_id(kJob);
    c.mutable_tag()->set_step(step);
    c.set_epoch(epoch);
    c.set_end_of_step(true);
    c.set_last(true);
    auto ended = h_[server]->Push(c, Payload());
    ASSERT_TRUE(ended.ok()) << ended.status();
  }

  // T is lost: its shards' backups take over, and worker 0 pushes step 4 again from its clock
  // there, then step 5.
  void LoseTAndGoOn(bool x_was_applied) {
    for (auto& t : transport_) t->Fail(kAddr[kT], absl::UnavailableError("killed"));
    const int t_now = GetParam() ? kB : kP;  // bt's new primary.
    for (int i : {kP, kB}) {
      absl::Status s = Install(i, Promoted(), {});
      ASSERT_TRUE(s.ok()) << "s" << i << ": " << s;
    }
    auto x = Push(kB, bx_, 4, 4, false, /*resent=*/x_was_applied);
    ASSERT_TRUE(x.ok()) << x.status();
    EXPECT_EQ(x->duplicate, x_was_applied) << "the moved shard's chunk of step 4";
    auto t = Push(t_now, bt_, 4, 4, false, /*resent=*/true);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->duplicate) << "T's own shard's chunk of step 4, applied and copied before";
    auto o = Push(kB, bo_, 4, 4, false);
    ASSERT_TRUE(o.ok()) << o.status();
    EndStep(kB, 4, 4);
    if (t_now == kP) EndStep(kP, 4, 4);
    RefEndStep(4);
    Step(5, 4, kB, t_now);
    ExpectAsReference({{bx_, kB}, {bt_, t_now}, {bo_, kB}}, 4);
  }

  static constexpr uint64_t kNone = ~uint64_t{0};
  FakeClock clock_;
  std::shared_ptr<InProcessBackupTransport> transport_[3];
  std::unique_ptr<PsHandler> h_[3];
  std::unique_ptr<PsHandler> ref_;
  uint64_t bx_ = kNone, bt_ = kNone, bo_ = kNone;
  uint32_t moved_ = 0;
};

TEST_P(MovedPrimaryCopyTest, TheKeptBackupTakesTheShardWithoutASecondCopyAndCanTakeOverAtOnce) {
  UpToTheSwitch();
  for (int i : {kP, kB, kT}) {
    absl::Status s = MoveMap2(i);
    ASSERT_TRUE(s.ok()) << "s" << i << ": " << s;
  }
  // The moved shard's chunk of step 4 lands on T (its push returns once B has everything T
  // queued: the clocks first).
  auto x = Push(kT, bx_, 4, 3, false);
  ASSERT_TRUE(x.ok() && x->applied) << x.status();
  EXPECT_EQ(transport_[kT]->seed_bytes(kAddr[kB]), 0u) << "no snapshot went from T to B";
  EXPECT_EQ(transport_[kT]->clocks_delivered(kAddr[kB]), 1) << "T's clocks went to B, once";
  auto copy = Replica(kB, Node(kT));
  ASSERT_TRUE(copy.has_value());
  EXPECT_TRUE(copy->seeded());
  EXPECT_TRUE(copy->caught_up()) << "B's copy is exact as soon as T's clocks arrive";
  bool holds = false;
  for (uint32_t s : copy->shards()) holds = holds || s == moved_;
  EXPECT_TRUE(holds) << "B backs the moved shard under T";
  if (auto under_p = Replica(kB, Node(kP)); under_p.has_value()) {
    for (uint32_t s : under_p->shards()) EXPECT_NE(s, moved_) << "nor under P any more";
  }
  LoseTAndGoOn(/*x_was_applied=*/true);
}

// T is lost before its clocks reach B: T acknowledged nothing under map 2 (its clocks are
// queued ahead of everything it applies), so B's copy, as P handed it over, is the shard.
TEST_P(MovedPrimaryCopyTest, TheKeptBackupTakesOverEvenBeforeTheNewPrimarysClocksCame) {
  UpToTheSwitch();
  ASSERT_TRUE(MoveMap2(kP).ok());
  ASSERT_TRUE(MoveMap2(kB).ok());
  transport_[kT]->Fail(kAddr[kB], absl::UnavailableError("cut off"));
  ASSERT_TRUE(MoveMap2(kT).ok());  // Its clocks for B stay queued (then fail).
  auto copy = Replica(kB, Node(kT));
  ASSERT_TRUE(copy.has_value());
  EXPECT_FALSE(copy->seeded());
  LoseTAndGoOn(/*x_was_applied=*/false);
}

// The old primary cannot hand everything it applied to the backup that keeps its copy: the map
// takes effect there, and its answer says so (the scheduler then recovers the job).
TEST_P(MovedPrimaryCopyTest, AnOldPrimaryThatCannotHandItsUpdatesOverToTheKeptCopySaysSo) {
  UpToTheSwitch();
  transport_[kP]->Fail(kAddr[kB], absl::UnavailableError("cut off"));
  // A chunk of step 4 applied on P, not yet delivered to B (a push's last chunk would wait).
  v1::PushChunk c;
  c.mutable_tag()->set_job_id(kJob);
  c.mutable_tag()->set_step(4);
  c.set_epoch(2);
  c.set_dtype(v1::DT_FLOAT32);
  c.mutable_slice()->set_table("w");
  c.mutable_slice()->set_block(bx_);
  std::vector<float> g(4, 1.f);
  auto applied = h_[kP]->Push(
      c, Payload::FromString(std::string(reinterpret_cast<const char*>(g.data()), 16)));
  ASSERT_TRUE(applied.ok()) << applied.status();
  absl::Status s = MoveMap2(kP);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("the backup at b:1 keeps its copy"), std::string::npos) << s;
}

// Map 1's live copy on T gets P's snapshot and then P's clocks and records of applied chunks:
// it is caught up at once, and a chunk P applied before the snapshot, pushed again once T has
// taken the shard over (P lost), is a duplicate there.
TEST_P(MovedPrimaryCopyTest, ANewLiveCopyDropsExactlyWhatItsPrimaryAppliedBeforeItsSnapshot) {
  for (int64_t step = 0; step < 3; ++step) Step(step, 1, kP, kT);
  auto early = Push(kP, bx_, 3, 1, false);  // Part of step 3, before the snapshot.
  ASSERT_TRUE(early.ok() && early->applied) << early.status();
  MoveMap1();
  EXPECT_TRUE(WaitFor(absl::Seconds(5), [&] {
    auto copy = Replica(kT, Node(kP));
    return copy.has_value() && copy->caught_up();
  })) << "caught up without a further step";
  EXPECT_GT(transport_[kP]->seed_bytes(kAddr[kT]), 0u);
  EXPECT_EQ(transport_[kP]->clocks_delivered(kAddr[kT]), 1);
  // P is lost: T takes the moved shard over, B the rest of P's shards.
  for (auto& t : transport_) t->Fail(kAddr[kP], absl::UnavailableError("killed"));
  v1::ShardMap promoted = Map1();
  promoted.set_epoch(3);
  for (auto& a : *promoted.mutable_assignments()) {
    if (a.primary() != Node(kP)) continue;
    a.set_primary(a.shard() == moved_ ? Node(kT) : Node(kB));
    a.clear_backups();
  }
  for (auto& a : *promoted.mutable_assignments()) {
    // Shards that P backed (B's) lose their backup.
    auto* b = a.mutable_backups();
    b->erase(std::remove(b->begin(), b->end(), Node(kP)), b->end());
  }
  promoted.mutable_servers()->DeleteSubrange(kP, 1);
  for (int i : {kB, kT}) {
    absl::Status s = Install(i, promoted, {});
    ASSERT_TRUE(s.ok()) << "s" << i << ": " << s;
  }
  auto again = Push(kT, bx_, 3, 3, false, /*resent=*/true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->duplicate) << "applied by P before the snapshot";
  EndStep(kT, 3, 3);
  auto o = Push(kB, bo_, 3, 3, false);
  ASSERT_TRUE(o.ok()) << o.status();
  EndStep(kB, 3, 3);
  RefEndStep(3);
  ExpectAsReference({{bx_, kT}, {bo_, kB}}, 3);
}

INSTANTIATE_TEST_SUITE_P(BackupOfTheTarget, MovedPrimaryCopyTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "AlreadyBackingTheTarget" : "NewToTheTarget";
                         });

}  // namespace
}  // namespace pscluster::testing
