// PsClient's routing and retries against real servers' handlers in this process, without
// sockets (testing::InProcessServers as its ServerConnector): every block and row reaches the
// server the map names; a stale map is refreshed and the call retried; a lost reply or a server
// that cannot be reached is retried and the push still applied once; a fenced task is refused
// at once; a server that never answers ends the call at its deadline.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/sharding.h"
#include "server/client/ps_client.h"
#include "server/testing/in_process_servers.h"
#include "server/testing/test_tables.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;
using testing::InProcessServers;

constexpr char kJob[] = "routing";
constexpr uint64_t kElems = 1000;   // Dense table "w": 10 blocks of 100.
constexpr uint32_t kWidth = 4;      // Sparse table "emb".
constexpr uint32_t kShards = 8;

std::vector<v1::TableSpec> Tables() {
  const auto sgd = testing::Optimizer(v1::OptimizerSpec::SGD, 1.0f);
  return {testing::DenseSpec("w", {kElems}, sgd, 100),
          testing::SparseSpec("emb", kWidth, 1 << 20, sgd)};
}

class PsClientRoutingTest : public ::testing::Test {
 protected:
  void SetUp() override { servers_ = std::make_shared<InProcessServers>(2); }

  // A client of rank `worker` routed by `map` (the servers get it too unless `install` is
  // false). Tables are declared on every server of the map.
  std::unique_ptr<PsClient> Client(v1::ShardMap map, uint32_t attempt = 0,
                                   absl::Duration timeout = absl::Seconds(20),
                                   bool install = true) {
    PsClientOptions o;
    o.job_id = kJob;
    o.attempt = attempt;
    o.call_timeout = timeout;
    o.retry_backoff = absl::Milliseconds(5);
    o.connector = servers_;
    o.refresh_shard_map = [this]() -> absl::StatusOr<v1::ShardMap> {
      ++refreshes_;
      if (!newer_map_.has_value()) return absl::UnavailableError("no newer map");
      return *newer_map_;
    };
    auto c = PsClient::Create(o, std::move(map), Tables());
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    EXPECT_TRUE((*c)->CreateTables(testing::Mode(v1::ConsistencySpec::BSP), 1).ok());
    if (install) {
      EXPECT_TRUE((*c)->InstallShardMap().ok());
    }
    return std::move(*c);
  }

  // Pushes a gradient of 1 everywhere for `step` (dense) and for `keys` (sparse).
  absl::Status PushOnes(PsClient& c, int64_t step, bool end_of_step = true) {
    std::vector<float> g(kElems, 1.0f), rows(keys_.size() * kWidth, 1.0f);
    PushSources src;
    src.dense.push_back({"w", g.data()});
    src.sparse.push_back({"emb", keys_, rows.data()});
    return c.Push(step, src, end_of_step);
  }

  // Pulls at `clock` and checks every value is its initial value minus `pushes` (SGD, lr 1).
  void ExpectPushedTimes(PsClient& c, int64_t clock, int pushes) {
    std::vector<float> w(kElems), rows(keys_.size() * kWidth);
    PullTargets t;
    t.dense.push_back({"w", w.data()});
    t.sparse.push_back({"emb", keys_, rows.data()});
    ASSERT_TRUE(c.Pull(clock, t).ok());
    const auto init_w = testing::InitialDense(Tables()[0], kElems);
    const auto init_rows = testing::InitialRows(Tables()[1], keys_);
    for (uint64_t i = 0; i < kElems; ++i) {
      ASSERT_NEAR(w[i], init_w[i] - pushes, 1e-5) << "w[" << i << "]";
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      ASSERT_NEAR(rows[i], init_rows[i] - pushes, 1e-5) << "emb row element " << i;
    }
  }

  int64_t ServerClock(int i) {
    v1::ServerStatusRequest req;
    req.set_job_id(kJob);
    v1::ServerStatus st;
    EXPECT_TRUE(servers_->handler(i)->Status(req, &st).ok());
    return st.jobs_size() > 0 && st.jobs(0).clocks_size() > 0 ? st.jobs(0).clocks(0).clock()
                                                               : -1;
  }

  std::shared_ptr<InProcessServers> servers_;
  std::vector<uint64_t> keys_ = {1, 5, 77, 1 << 19, 123456, 42};
  std::optional<v1::ShardMap> newer_map_;
  int refreshes_ = 0;
};

TEST_F(PsClientRoutingTest, EveryBlockAndRowReachesTheServerTheMapNames) {
  auto c = Client(servers_->Map(kJob, kShards, 1, {0, 1}));
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(PushOnes(*c, 0).ok());
  ExpectPushedTimes(*c, 1, 1);
  EXPECT_GT(servers_->rounds(0), 0);
  EXPECT_GT(servers_->rounds(1), 0);
  EXPECT_EQ(ServerClock(0), 1);
  EXPECT_EQ(ServerClock(1), 1);
  EXPECT_EQ(c->stats().retries, 0u);

  // Every shard on server 1: server 0 is no longer in the map and gets nothing.
  const int before = servers_->rounds(0);
  ASSERT_TRUE(c->SetShardMap(servers_->Map(kJob, kShards, 2, {1})).ok());
  ASSERT_TRUE(c->InstallShardMap().ok());
  EXPECT_EQ(c->InstallShardMap().code(), absl::StatusCode::kOk);
  ASSERT_TRUE(PushOnes(*c, 1).ok());
  EXPECT_EQ(servers_->rounds(0), before);
  EXPECT_EQ(ServerClock(1), 2);
}

TEST_F(PsClientRoutingTest, AStaleMapIsRefreshedAndTheCallRetriedWithTheNewOne) {
  // The servers run epoch 2 (shards swapped between them); the client still routes by epoch 1.
  auto c = Client(servers_->Map(kJob, kShards, 1, {0, 1}), 0, absl::Seconds(20),
                  /*install=*/false);
  ASSERT_NE(c, nullptr);
  v1::ShardMap epoch2 = servers_->Map(kJob, kShards, 2, {1, 0});
  for (int i = 0; i < 2; ++i) {
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = epoch2;
    req.set_self(InProcessServers::NodeId(i));
    v1::UpdateShardMapResponse resp;
    ASSERT_TRUE(servers_->handler(i)->UpdateShardMap(req, &resp).ok());
  }
  newer_map_ = epoch2;
  ASSERT_TRUE(PushOnes(*c, 0).ok());
  EXPECT_EQ(refreshes_, 1);
  EXPECT_EQ(c->shard_map().epoch(), 2u);
  EXPECT_GE(c->stats().retries, 1u);
  ExpectPushedTimes(*c, 1, 1);
}

TEST_F(PsClientRoutingTest, APushWhoseReplyWasLostIsRetriedAndAppliedOnce) {
  auto c = Client(servers_->Map(kJob, kShards, 1, {0, 1}));
  ASSERT_NE(c, nullptr);
  // A push that does not end the step: only its tags tell the servers that the retry is the
  // same push (the rank's clock does not move past it).
  servers_->LoseReplies(0, 1);
  servers_->LoseReplies(1, 1);
  ASSERT_TRUE(PushOnes(*c, 0, /*end_of_step=*/false).ok());
  EXPECT_GE(c->stats().retries, 1u);
  EXPECT_GE(servers_->rounds(0), 2) << "the round was sent again";
  ASSERT_TRUE(c->Push(0, PushSources{}, /*end_of_step=*/true).ok());
  ExpectPushedTimes(*c, 1, 1);  // Not 2: the servers took the retry for a duplicate.
  // A push that ends the step, its replies lost too.
  servers_->LoseReplies(0, 1);
  servers_->LoseReplies(1, 1);
  ASSERT_TRUE(PushOnes(*c, 1).ok());
  ExpectPushedTimes(*c, 2, 2);
}

TEST_F(PsClientRoutingTest, AServerThatCannotBeReachedIsRetriedUntilItCan) {
  auto c = Client(servers_->Map(kJob, kShards, 1, {0, 1}));
  ASSERT_NE(c, nullptr);
  servers_->FailOpens(1, 3, absl::UnavailableError("connection refused (injected)"));
  ASSERT_TRUE(PushOnes(*c, 0).ok());
  EXPECT_GE(servers_->opens(1), 4);
  EXPECT_GE(c->stats().retries, 3u);
  ExpectPushedTimes(*c, 1, 1);
}

TEST_F(PsClientRoutingTest, AnErrorThatIsNotTransientIsReturnedWithoutRetry) {
  auto c = Client(servers_->Map(kJob, kShards, 1, {0, 1}));
  ASSERT_NE(c, nullptr);
  servers_->FailOpens(0, 1, absl::PermissionDeniedError("refused (injected)"));
  absl::Status st = PushOnes(*c, 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_EQ(c->stats().retries, 0u);
}

TEST_F(PsClientRoutingTest, AFencedTaskIsRefusedAtOnceWithoutRetry) {
  auto c = Client(servers_->Map(kJob, kShards, 1, {0, 1}), /*attempt=*/1);
  ASSERT_NE(c, nullptr);
  for (int i = 0; i < 2; ++i) {
    v1::FenceWorkerRequest req;
    req.set_job_id(kJob);
    req.set_worker(0);
    req.set_attempt(2);
    v1::FenceWorkerResponse resp;
    ASSERT_TRUE(servers_->handler(i)->FenceWorker(req, &resp).ok());
  }
  absl::Status st = PushOnes(*c, 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("handed to a newer task (attempt 2)"));
  EXPECT_EQ(c->stats().retries, 0u);
  EXPECT_EQ(ServerClock(0), 0) << "nothing completed the step";
}

TEST_F(PsClientRoutingTest, AServerThatNeverAnswersEndsTheCallAtItsDeadline) {
  auto c = Client(servers_->Map(kJob, kShards, 1, {0, 1}), 0, absl::Milliseconds(500));
  ASSERT_NE(c, nullptr);
  servers_->Stall(1, true);
  absl::Status st = PushOnes(*c, 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(InProcessServers::Address(1)));
  servers_->Stall(1, false);
  ASSERT_TRUE(PushOnes(*c, 0).ok()) << "the same push, now answered";
  ExpectPushedTimes(*c, 1, 1);
}

TEST_F(PsClientRoutingTest, TheGrpcStreamCarriesRoundsWithoutSocketsToo) {
  servers_->UseGrpcData(0, true);
  servers_->UseGrpcData(1, true);
  auto c = Client(servers_->Map(kJob, kShards, 1, {0, 1}));
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(PushOnes(*c, 0).ok());
  ExpectPushedTimes(*c, 1, 1);
  EXPECT_EQ(servers_->opens(0), 0) << "no in-memory connection was opened";
}

TEST_F(PsClientRoutingTest, AMapNamingAnAddressTheConnectorCannotReachIsRefused) {
  v1::ShardMap map = servers_->Map(kJob, kShards, 1, {0, 1});
  map.mutable_servers(1)->set_address("in-process:9");
  PsClientOptions o;
  o.job_id = kJob;
  o.connector = servers_;
  auto c = PsClient::Create(o, map, Tables());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("map.servers[1].address: 'in-process:9' is not the address"));
}

}  // namespace
}  // namespace pscluster
