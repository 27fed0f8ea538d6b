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

}  // namespace
}  // namespace pscluster::testing
