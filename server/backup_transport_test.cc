// Replication between two PsHandlers in this process over an InProcessBackupTransport (no
// sockets): each server backs the other's shards; a push is acknowledged once its backup holds
// it, and one whose backup cannot be reached fails naming it and marks it unreachable.
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/sharding.h"
#include "gtest/gtest.h"
#include "server/ps_handler.h"
#include "server/testing/in_process_backup_transport.h"
#include "server/testing/test_tables.h"

namespace pscluster::testing {
namespace {

constexpr char kJob[] = "j";
const std::vector<std::string> kAddresses = {"a:1", "b:2"};

class InProcessReplicationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      PsHandlerOptions o;
      o.checkpoint_dir = TempDir(absl::StrCat("in_process_replication_", i));
      o.replication_retry = absl::Milliseconds(300);
      h_[i] = std::make_unique<PsHandler>(o, &clock_, [](std::function<void()> f) { f(); });
      h_[i]->set_node_id(absl::StrCat("s", i));
      h_[i]->set_address(kAddresses[i]);
      h_[i]->set_backup_transport(transport_);
      transport_->Add(kAddresses[i], h_[i].get());
    }
    // As a worker does at the start of a job: the map first, then the tables.
    for (int i = 0; i < 2; ++i) {
      v1::UpdateShardMapRequest req;
      *req.mutable_map() = ReplicatedMap(kJob, 1, kAddresses);
      req.set_self(absl::StrCat("s", i));
      v1::UpdateShardMapResponse resp;
      absl::Status s = h_[i]->UpdateShardMap(req, &resp);
      ASSERT_TRUE(s.ok()) << s;
    }
    for (int i = 0; i < 2; ++i) {
      v1::CreateTablesResponse created;
      absl::Status s = h_[i]->CreateTables(
          CreateRequest(kJob, {DenseSpec("w", {16, 4}, kSgd, 4)}, v1::ConsistencySpec::ASP, 1),
          &created);
      ASSERT_TRUE(s.ok()) << s;
    }
    // A block whose shard s0 is primary of (RoundRobinMap: even shards).
    const uint64_t th = TableHash("w");
    for (uint64_t b = 0; b < 16 && block_ == 99; ++b) {
      if (ShardOfBlock(th, b, 16) % 2 == 0) block_ = b;
    }
    ASSERT_NE(block_, 99u);
  }

  // Worker 0 pushes step `step` of block_ to s0 (the block's primary).
  absl::StatusOr<PushResult> Push(int64_t step) {
    v1::PushChunk c;
    c.mutable_tag()->set_job_id(kJob);
    c.mutable_tag()->set_worker(0);
    c.mutable_tag()->set_step(step);
    c.set_epoch(1);
    c.set_dtype(v1::DT_FLOAT32);
    c.mutable_slice()->set_table("w");
    c.mutable_slice()->set_block(block_);
    c.set_end_of_step(true);
    c.set_last(true);
    std::vector<float> g(4, 1.f);
    return h_[0]->Push(c, Payload::FromString(std::string(
                              reinterpret_cast<const char*>(g.data()), g.size() * 4)));
  }

  v1::JobOnServer Job(int i) {
    v1::ServerStatusRequest req;
    req.set_job_id(kJob);
    v1::ServerStatus st;
    EXPECT_TRUE(h_[i]->Status(req, &st).ok());
    EXPECT_EQ(st.jobs_size(), 1);
    return st.jobs_size() == 1 ? st.jobs(0) : v1::JobOnServer();
  }

  const v1::OptimizerSpec kSgd = Optimizer(v1::OptimizerSpec::SGD, 0.5f);
  FakeClock clock_;
  std::shared_ptr<InProcessBackupTransport> transport_ =
      std::make_shared<InProcessBackupTransport>();
  std::unique_ptr<PsHandler> h_[2];
  uint64_t block_ = 99;
};

TEST_F(InProcessReplicationTest, APushIsAcknowledgedOnceItsBackupHoldsIt) {
  for (int64_t step = 0; step < 3; ++step) {
    auto pushed = Push(step);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
  }
  EXPECT_GE(transport_->delivered("b:2"), 3);
  EXPECT_EQ(transport_->delivered("a:1"), 0) << "s1 pushed nothing";
  // s1's copy of s0's shards has worker 0 at clock 3, as s0 has it.
  v1::JobOnServer backup = Job(1);
  ASSERT_EQ(backup.replicas_size(), 1);
  EXPECT_EQ(backup.replicas(0).primary(), "s0");
  ASSERT_GE(backup.replicas(0).clocks_size(), 1);
  EXPECT_EQ(backup.replicas(0).clocks(0).clock(), 3);
  EXPECT_TRUE(Job(0).unreachable_backups().empty());
}

TEST_F(InProcessReplicationTest, APushWhoseBackupCannotBeReachedFailsNamingIt) {
  ASSERT_TRUE(Push(0).ok());
  transport_->Fail("b:2", absl::UnavailableError("connection refused"));
  auto pushed = Push(1);
  ASSERT_FALSE(pushed.ok());
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kUnavailable) << pushed.status();
  EXPECT_NE(pushed.status().message().find("replicating to the backup at b:2"),
            std::string::npos)
      << pushed.status();
  v1::JobOnServer primary = Job(0);
  ASSERT_EQ(primary.unreachable_backups_size(), 1);
  EXPECT_EQ(primary.unreachable_backups(0), "b:2");
  // The backup kept what it had: step 0 only.
  EXPECT_EQ(Job(1).replicas(0).clocks(0).clock(), 1);
}

// A shard taken over by a server that keeps backing its old primary's other shards (a move or a
// promotion onto it). The worker's round of step 1 reaches the new primary's own shards first,
// then the old primary after it switched (the moved shard's chunk is refused there); its retry
// under the new map reaches the old primary's other shards, whose step end the kept copy
// receives, before the new primary takes the map. Taking the shard over, the new primary must
// adopt the copy's clocks as they were before the new map's chunks: the moved shard's chunk of
// step 1, which no server applied, is then applied once and not taken for a duplicate.
TEST_F(InProcessReplicationTest, AShardTakenOverKeepsTheStepItsOldPrimaryNeverApplied) {
  const uint64_t th = TableHash("w");
  // bx: the block that moves (an even shard, s0's); by: another even shard's; bo: an odd one's.
  uint64_t bx = 99, by = 99, bo = 99;
  for (uint64_t b = 0; b < 16; ++b) {
    const uint32_t shard = ShardOfBlock(th, b, 16);
    if (shard % 2 == 1) {
      if (bo == 99) bo = b;
    } else if (bx == 99) {
      bx = b;
    } else if (by == 99 && shard != ShardOfBlock(th, bx, 16)) {
      by = b;
    }
  }
  ASSERT_TRUE(bx != 99 && by != 99 && bo != 99);
  const uint32_t moved = ShardOfBlock(th, bx, 16);
  auto push = [&](int server, uint64_t block, int64_t step, uint64_t epoch, bool eos) {
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
    std::vector<float> g(4, 1.f);
    return h_[server]->Push(c, Payload::FromString(std::string(
                                   reinterpret_cast<const char*>(g.data()), g.size() * 4)));
  };
  auto install = [&](int server, const v1::ShardMap& map) {
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = map;
    req.set_self(absl::StrCat("s", server));
    v1::UpdateShardMapResponse resp;
    return h_[server]->UpdateShardMap(req, &resp);
  };
  // Map 2: s1 is the moved shard's primary (its copy there takes over), with no backup.
  v1::ShardMap map2 = ReplicatedMap(kJob, 2, kAddresses);
  map2.mutable_assignments(static_cast<int>(moved))->set_primary("s1");
  map2.mutable_assignments(static_cast<int>(moved))->clear_backups();

  // Step 0 everywhere.
  ASSERT_TRUE(push(0, bx, 0, 1, false).ok());
  ASSERT_TRUE(push(0, by, 0, 1, true).ok());
  ASSERT_TRUE(push(1, bo, 0, 1, true).ok());
  // Step 1, first try: s1's part lands; s0 switched before the moved block's chunk.
  ASSERT_TRUE(push(1, bo, 1, 1, true).ok());
  ASSERT_TRUE(install(0, map2).ok());
  EXPECT_EQ(push(0, bx, 1, 1, false).status().code(), absl::StatusCode::kFailedPrecondition);
  // Second try, under map 2: s0's part (its step end reaches s1's copy); s1 is not there yet.
  ASSERT_TRUE(push(0, by, 1, 2, true).ok());
  EXPECT_EQ(push(1, bx, 1, 2, false).status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(install(1, map2).ok());
  // Third try: the moved block's step 1 is applied, once.
  auto applied = push(1, bx, 1, 2, false);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_FALSE(applied->duplicate) << "the step no server applied was taken for a duplicate";
  EXPECT_TRUE(applied->applied);
  auto again = push(1, bx, 1, 2, false);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicate) << "and once only";
  ASSERT_TRUE(push(1, bo, 1, 2, true).ok());
}

}  // namespace
}  // namespace pscluster::testing
