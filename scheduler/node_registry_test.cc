#include "scheduler/node_registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/status_matchers.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

v1::NodeInfo Info(v1::NodeRole role, const std::string& address, int64_t pid = 100) {
  v1::NodeInfo i;
  i.set_role(role);
  i.set_address(address);
  i.set_pid(pid);
  return i;
}

class NodeRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::string(std::getenv("TEST_TMPDIR")) + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".db";
    std::remove(path_.c_str());
    Reopen();
  }
  void Reopen() {
    registry_.reset();
    store_.reset();
    auto s = Store::Open(StoreOptions{path_, false});
    ASSERT_THAT(s, IsOk());
    store_ = std::move(*s);
    registry_ = std::make_unique<NodeRegistry>(RegistryOptions{absl::Seconds(10)}, &clock_,
                                               store_.get());
    ASSERT_THAT(registry_->Restore(), IsOk());
  }
  v1::NodeState State(const std::string& id) { return registry_->Get(id)->state(); }
  absl::Status Beat(const std::string& id) {
    v1::HeartbeatRequest hb;
    hb.set_node_id(id);
    return registry_->Heartbeat(hb);
  }

  FakeClock clock_;
  std::string path_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<NodeRegistry> registry_;
};

TEST_F(NodeRegistryTest, AssignsIdsPerRole) {
  auto a = registry_->Register(Info(v1::ROLE_SERVER, "h1:1000"));
  auto b = registry_->Register(Info(v1::ROLE_WORKER, "h1:2000"));
  auto c = registry_->Register(Info(v1::ROLE_SERVER, "h2:1000"));
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(a->node_id, "server-1");
  EXPECT_EQ(b->node_id, "worker-1");
  EXPECT_EQ(c->node_id, "server-2");
  EXPECT_TRUE(a->is_new);
  EXPECT_EQ(registry_->Live(v1::ROLE_SERVER).size(), 2u);
}

TEST_F(NodeRegistryTest, ReRegisteringTheSameAddressKeepsTheId) {
  auto a = registry_->Register(Info(v1::ROLE_WORKER, "h1:2000"));
  ASSERT_THAT(a, IsOk());
  auto again = registry_->Register(Info(v1::ROLE_WORKER, "h1:2000"));
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->node_id, a->node_id);
  EXPECT_FALSE(again->is_new);
  EXPECT_FALSE(again->restarted);
  // A new process at the same address (another pid) keeps the id but is flagged as restarted.
  auto restarted = registry_->Register(Info(v1::ROLE_WORKER, "h1:2000", 101));
  ASSERT_THAT(restarted, IsOk());
  EXPECT_EQ(restarted->node_id, a->node_id);
  EXPECT_TRUE(restarted->restarted);
  // A node that remembers its id keeps it when its address changes.
  v1::NodeInfo moved = Info(v1::ROLE_WORKER, "h1:2001", 101);
  moved.set_node_id(a->node_id);
  auto m = registry_->Register(moved);
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->node_id, a->node_id);
  EXPECT_EQ(registry_->Get(a->node_id)->info().address(), "h1:2001");
}

TEST_F(NodeRegistryTest, LeaseExpiryMarksSuspectThenDead) {
  auto a = registry_->Register(Info(v1::ROLE_SERVER, "h1:1000"));
  auto b = registry_->Register(Info(v1::ROLE_SERVER, "h2:1000"));
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  clock_.Advance(absl::Seconds(6));
  ASSERT_THAT(Beat(b->node_id), IsOk());
  EXPECT_THAT(registry_->ExpireLeases(), IsEmpty());
  EXPECT_EQ(State(a->node_id), v1::NODE_SUSPECT);
  EXPECT_EQ(State(b->node_id), v1::NODE_ALIVE);
  // A heartbeat brings a suspect back.
  ASSERT_THAT(Beat(a->node_id), IsOk());
  EXPECT_EQ(State(a->node_id), v1::NODE_ALIVE);
  clock_.Advance(absl::Seconds(10) + absl::Milliseconds(1));
  ASSERT_THAT(Beat(b->node_id), IsOk());
  EXPECT_THAT(registry_->ExpireLeases(), ElementsAre(a->node_id));
  EXPECT_EQ(State(a->node_id), v1::NODE_DEAD);
  EXPECT_THAT(registry_->ExpireLeases(), IsEmpty());  // Reported once.
  // A dead node's heartbeat is refused; it registers again and keeps its id.
  EXPECT_THAT(Beat(a->node_id), StatusIs(absl::StatusCode::kNotFound, HasSubstr("lease expired")));
  auto back = registry_->Register(Info(v1::ROLE_SERVER, "h1:1000"));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->node_id, a->node_id);
  EXPECT_EQ(State(a->node_id), v1::NODE_ALIVE);
}

TEST_F(NodeRegistryTest, HeartbeatErrorsAreExact) {
  EXPECT_THAT(Beat("server-77"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("server-77")));
  auto a = registry_->Register(Info(v1::ROLE_SERVER, "h1:1000"));
  ASSERT_THAT(a, IsOk());
  v1::HeartbeatRequest hb;
  hb.set_node_id(a->node_id);
  hb.mutable_load()->set_bytes_per_sec(-5);
  EXPECT_THAT(registry_->Heartbeat(hb), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 HasSubstr("load.bytes_per_sec")));
  hb.mutable_load()->set_bytes_per_sec(5);
  hb.add_shard_loads()->mutable_load()->set_requests_per_sec(std::nan(""));
  EXPECT_THAT(registry_->Heartbeat(hb), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 HasSubstr("shard_loads[0].load.requests_per_sec")));
  ASSERT_THAT(registry_->Deregister(a->node_id), IsOk());
  EXPECT_THAT(Beat(a->node_id), StatusIs(absl::StatusCode::kNotFound, HasSubstr("deregistered")));
  EXPECT_EQ(State(a->node_id), v1::NODE_LEFT);
  EXPECT_THAT(registry_->Deregister("nobody"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(NodeRegistryTest, BadRegistrationsNameTheField) {
  EXPECT_THAT(registry_->Register(Info(v1::ROLE_CLIENT, "h:1")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node.role")));
  EXPECT_THAT(registry_->Register(Info(v1::ROLE_SERVER, "h1")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node.address: 'h1'")));
  EXPECT_THAT(registry_->Register(Info(v1::ROLE_SERVER, "h1:0")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("port 0")));
  EXPECT_THAT(registry_->Register(Info(v1::ROLE_SERVER, "h1:99999")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node.address")));
  auto w = registry_->Register(Info(v1::ROLE_WORKER, "h1:5"));
  ASSERT_THAT(w, IsOk());
  v1::NodeInfo wrong = Info(v1::ROLE_SERVER, "h1:6");
  wrong.set_node_id(w->node_id);
  EXPECT_THAT(registry_->Register(wrong),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node.node_id")));
  EXPECT_THAT(registry_->Snapshot().size(), 1u);
}

TEST_F(NodeRegistryTest, RestoredNodesKeepIdsAndGetAFreshLease) {
  auto a = registry_->Register(Info(v1::ROLE_SERVER, "h1:1000"));
  auto b = registry_->Register(Info(v1::ROLE_WORKER, "h2:1000"));
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  ASSERT_THAT(registry_->Deregister(b->node_id), IsOk());
  clock_.Advance(absl::Seconds(9));
  Reopen();  // The scheduler restarted.
  EXPECT_EQ(State(a->node_id), v1::NODE_SUSPECT);  // Until it is heard from.
  EXPECT_EQ(State(b->node_id), v1::NODE_LEFT);
  clock_.Advance(absl::Seconds(9));
  EXPECT_THAT(registry_->ExpireLeases(), IsEmpty());  // Lease counted from the restart.
  ASSERT_THAT(Beat(a->node_id), IsOk());
  EXPECT_EQ(State(a->node_id), v1::NODE_ALIVE);
  // New registrations continue the id sequence.
  auto c = registry_->Register(Info(v1::ROLE_SERVER, "h3:1000"));
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->node_id, "server-2");
  auto again = registry_->Register(Info(v1::ROLE_SERVER, "h1:1000"));
  EXPECT_EQ(again->node_id, a->node_id);
}

}  // namespace
}  // namespace pscluster::scheduler
