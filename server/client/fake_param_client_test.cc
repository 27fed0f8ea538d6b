// The fake parameter client: the servers' initial values and update rules, reads that create
// no rows, a push repeated after a failure applied once, failures and held pulls on demand.
#include "server/client/testing/fake_param_client.h"

#include <thread>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/initializer.h"

namespace pscluster {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Call = FakeParameterStore::Call;

std::vector<v1::TableSpec> Tables(v1::OptimizerSpec::Kind kind = v1::OptimizerSpec::SGD) {
  v1::TableSpec dense;
  dense.set_name("w");
  dense.set_kind(v1::DENSE);
  dense.mutable_shape()->add_dims(2);
  dense.mutable_shape()->add_dims(3);
  dense.mutable_init()->set_kind(v1::InitializerSpec::UNIFORM);
  dense.mutable_init()->set_low(-1);
  dense.mutable_init()->set_high(1);
  dense.mutable_optimizer()->set_kind(kind);
  dense.mutable_optimizer()->set_learning_rate(0.5f);
  v1::TableSpec sparse = dense;
  sparse.set_name("emb");
  sparse.set_kind(v1::SPARSE);
  sparse.clear_shape();
  sparse.set_row_width(2);
  return {dense, sparse};
}

v1::ShardMap Map(uint64_t epoch) {
  v1::ShardMap m;
  m.set_job_id("job-1");
  m.set_epoch(epoch);
  return m;
}

class FakeParamClientTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_THAT(client_.CreateTables({}, 1), IsOk()); }

  std::shared_ptr<FakeParameterStore> store_ = std::make_shared<FakeParameterStore>();
  FakeParamClient client_{store_, 0, Map(1), Tables()};
};

TEST_F(FakeParamClientTest, PullsReadTheInitialValuesAndCreateNoRows) {
  std::vector<float> w(6), rows(4);
  std::vector<uint64_t> keys = {7, 9};
  ASSERT_THAT(client_.Pull(0, {{{"w", w.data()}}, {{"emb", keys, rows.data()}}}), IsOk());
  std::vector<float> want(6);
  Initializer(Tables()[0]).FillDense(0, 6, want.data());
  EXPECT_EQ(w, want);
  std::vector<float> row9(2);
  Initializer(Tables()[1]).FillRow(9, 2, row9.data());
  EXPECT_EQ(rows[2], row9[0]);
  EXPECT_EQ(rows[3], row9[1]);
  EXPECT_EQ(store_->rows("emb"), 0u);
  EXPECT_THAT(store_->pull_clocks(0), ElementsAre(0));
}

TEST_F(FakeParamClientTest, PushesApplyTheUpdateRuleOncePerKeyWithDuplicatesSummed) {
  const std::vector<float> before = store_->Dense("w");
  std::vector<float> g = {1, 2, 3, 4, 5, 6};
  std::vector<uint64_t> keys = {7, 7};
  std::vector<float> rg = {1, 1, 2, 2};
  ASSERT_THAT(client_.Push(0, {{{"w", g.data()}}, {{"emb", keys, rg.data()}}}), IsOk());
  const std::vector<float> after = store_->Dense("w");
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 0.5f * g[i]) << i;
  std::vector<float> init(2);
  Initializer(Tables()[1]).FillRow(7, 2, init.data());
  auto row = store_->Row("emb", 7);
  ASSERT_TRUE(row.has_value());
  EXPECT_FLOAT_EQ((*row)[0], init[0] - 0.5f * 3);
  EXPECT_EQ(store_->rows("emb"), 1u);
  ASSERT_EQ(store_->pushes().size(), 1u);
  EXPECT_EQ(store_->pushes()[0].step, 0);
}

TEST_F(FakeParamClientTest, APushRepeatedAfterAFailureIsAppliedOnce) {
  std::vector<float> g(6, 1.f);
  // The push itself failed: nothing applied; its repetition is applied.
  store_->FailNext(Call::kPush, absl::UnavailableError("server restarting"));
  EXPECT_THAT(client_.Push(3, {{{"w", g.data()}}, {}}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("restarting")));
  EXPECT_TRUE(store_->pushes().empty());
  ASSERT_THAT(client_.Push(3, {{{"w", g.data()}}, {}}), IsOk());
  ASSERT_EQ(store_->pushes().size(), 1u);
  const std::vector<float> once = store_->Dense("w");
  // Applied, but its reply lost: the repetition has the same tag and changes nothing.
  store_->FailAfterApplying(Call::kPush, absl::DeadlineExceededError("reply lost"));
  EXPECT_THAT(client_.Push(4, {{{"w", g.data()}}, {}}),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  const std::vector<float> twice = store_->Dense("w");
  EXPECT_NE(twice, once);
  ASSERT_THAT(client_.Push(4, {{{"w", g.data()}}, {}}), IsOk());
  EXPECT_EQ(store_->Dense("w"), twice);
  EXPECT_EQ(store_->duplicate_pushes(), 1u);
  EXPECT_EQ(store_->pushes().size(), 2u);
  // A further push of the same step is another push (its own tag).
  ASSERT_THAT(client_.Push(4, {{{"w", g.data()}}, {}}, false), IsOk());
  EXPECT_EQ(store_->pushes().size(), 3u);
  EXPECT_EQ(store_->duplicate_pushes(), 1u);
}

TEST_F(FakeParamClientTest, FailuresComeAfterTheCallsLetThrough) {
  std::vector<float> w(6);
  store_->FailNext(Call::kPull, absl::AbortedError("attempt 0 fenced"), 1, 2);
  EXPECT_THAT(client_.Pull(0, {{{"w", w.data()}}, {}}), IsOk());
  EXPECT_THAT(client_.Pull(1, {{{"w", w.data()}}, {}}), IsOk());
  EXPECT_THAT(client_.Pull(2, {{{"w", w.data()}}, {}}), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(client_.Pull(3, {{{"w", w.data()}}, {}}), IsOk());
  EXPECT_THAT(store_->pull_clocks(0), ElementsAre(0, 1, 3));
}

TEST_F(FakeParamClientTest, CancelReleasesAHeldPullAndFailsLaterCalls) {
  store_->HoldPulls();
  std::vector<float> w(6);
  absl::Status pulled;
  std::thread t([&] { pulled = client_.Pull(0, {{{"w", w.data()}}, {}}); });
  ASSERT_TRUE(store_->WaitForHeldPulls(1, absl::Seconds(30)));
  client_.Cancel();
  t.join();
  EXPECT_THAT(pulled, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(client_.Push(0, {{{"w", w.data()}}, {}}), StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(FakeParamClientTest, UnknownTablesAndUnsupportedSpecsAreRefusedByName) {
  std::vector<float> w(6);
  EXPECT_THAT(client_.Pull(0, {{{"nope", w.data()}}, {}}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'nope'")));
  auto tables = Tables();
  tables[0].mutable_compression()->set_topk_ratio(0.1f);
  FakeParamClient other(std::make_shared<FakeParameterStore>(), 0, Map(1), tables);
  EXPECT_THAT(other.CreateTables({}, 1),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("tables[0] ('w').compression")));
  // Another rank declaring different tables in the same store.
  FakeParamClient differing(store_, 1, Map(1), tables);
  EXPECT_THAT(differing.CreateTables({}, 1),
              StatusIs(absl::StatusCode::kUnimplemented));
  tables[0].clear_compression();
  tables[0].mutable_optimizer()->set_learning_rate(0.1f);
  FakeParamClient other_lr(store_, 1, Map(1), tables);
  EXPECT_THAT(other_lr.CreateTables({}, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("'w'")));
  EXPECT_THAT(client_.CreateTables({}, 1, 10, "/tmp"),
              StatusIs(absl::StatusCode::kUnimplemented));
}

TEST_F(FakeParamClientTest, TheShardMapOnlyMovesForward) {
  ASSERT_THAT(client_.SetShardMap(Map(5)), IsOk());
  ASSERT_THAT(client_.SetShardMap(Map(3)), IsOk());
  EXPECT_EQ(client_.shard_map().epoch(), 5u);
  v1::ShardMap other = Map(9);
  other.set_job_id("job-2");
  EXPECT_THAT(client_.SetShardMap(other), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pscluster
