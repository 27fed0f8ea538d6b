#include "scheduler/rebalance.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster::scheduler {
namespace {

constexpr double kMiB = 1 << 20;

struct Shard {
  std::string primary;
  double mib_per_sec = 0;
  std::vector<std::string> backups = {};
};

// A map of job "job" with one virtual shard per entry of `shards`, over `servers`.
v1::ShardMap Map(const std::vector<std::string>& servers, const std::vector<Shard>& shards) {
  v1::ShardMap map;
  map.set_job_id("job");
  map.set_epoch(3);
  map.set_num_virtual_shards(static_cast<uint32_t>(shards.size()));
  for (uint32_t i = 0; i < shards.size(); ++i) {
    v1::ShardAssignment* a = map.add_assignments();
    a->set_shard(i);
    a->set_primary(shards[i].primary);
    for (const std::string& b : shards[i].backups) a->add_backups(b);
  }
  for (const std::string& s : servers) {
    v1::ServerEndpoint* e = map.add_servers();
    e->set_node_id(s);
    e->set_address(s + ":7000");
  }
  return map;
}

v1::ShardLoad Load(uint32_t shard, double bytes_per_sec, const std::string& job = "job") {
  v1::ShardLoad l;
  l.set_job_id(job);
  l.set_shard(shard);
  l.mutable_load()->set_bytes_per_sec(bytes_per_sec);
  return l;
}

// The loads of `shards` as their servers report them.
std::vector<v1::ShardLoad> Loads(const std::vector<Shard>& shards) {
  std::vector<v1::ShardLoad> out;
  for (uint32_t i = 0; i < shards.size(); ++i) out.push_back(Load(i, shards[i].mib_per_sec * kMiB));
  return out;
}

std::optional<ShardMove> Pick(const std::vector<std::string>& servers,
                              const std::vector<Shard>& shards, RebalanceOptions options = {}) {
  return PickShardMove(Map(servers, shards), Loads(shards), options);
}

TEST(PickShardMoveTest, BalancedJobGivesNullopt) {
  EXPECT_EQ(Pick({"a", "b"}, {{"a", 5}, {"b", 4}, {"a", 1}, {"b", 2}}), std::nullopt);
  EXPECT_EQ(Pick({"a", "b", "c"}, {{"a", 0}, {"b", 0}, {"c", 0}}), std::nullopt);
  EXPECT_EQ(PickShardMove(Map({"a", "b"}, {{"a"}, {"b"}}), {}, {}), std::nullopt);
}

TEST(PickShardMoveTest, MovesHotShardToColderServer) {
  auto move = Pick({"a", "b"}, {{"a", 8}, {"a", 1}, {"a", 1}, {"b", 0.5}});
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->shard, 0u);
  EXPECT_EQ(move->from, "a");
  EXPECT_EQ(move->to, "b");
  EXPECT_DOUBLE_EQ(move->bytes_per_sec, 8 * kMiB);
  EXPECT_DOUBLE_EQ(move->from_load, 10 * kMiB);
  EXPECT_DOUBLE_EQ(move->to_load, 0.5 * kMiB);
}

TEST(PickShardMoveTest, HotServerIsFoundWhereverItIsListed) {
  auto move = Pick({"a", "b", "c"}, {{"b", 1}, {"c", 9}, {"a", 1}, {"c", 1}});
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->from, "c");
  EXPECT_EQ(move->to, "a");  // a and b tie at 1 MiB/s: node_id order.
  EXPECT_EQ(move->shard, 3u);  // Shard 1 (9) would leave a at 10, not below c's 10.
  EXPECT_DOUBLE_EQ(move->from_load, 10 * kMiB);
}

TEST(PickShardMoveTest, ShardWhoseMoveOnlySwapsTheImbalanceIsNotPicked) {
  // Moving shard 0 (20) would leave b at 22 > 21: only shard 1 lowers the pair's maximum.
  auto move = Pick({"a", "b"}, {{"a", 20}, {"a", 1}, {"b", 2}});
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->shard, 1u);
  EXPECT_EQ(move->to, "b");
  // With only the one hot shard, nothing helps.
  EXPECT_EQ(Pick({"a", "b"}, {{"a", 20}, {"b", 0}}), std::nullopt);
  EXPECT_EQ(Pick({"a", "b"}, {{"a", 20}, {"b", 1}}), std::nullopt);  // 21 vs 20: not lower.
}

TEST(PickShardMoveTest, PicksShardThatMinimisesThePairsMaximumLowestIndexOnTies) {
  // from 12, to 0: moving 6 gives max(6, 6); moving 4 gives 8; moving 2 gives 10.
  auto move = Pick({"a", "b"}, {{"a", 2}, {"a", 4}, {"b", 0}, {"a", 6}});
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->shard, 3u);
  // Two shards of equal load: the lower index.
  move = Pick({"a", "b"}, {{"b", 0}, {"a", 3}, {"a", 3}, {"a", 3}});
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->shard, 1u);
}

TEST(PickShardMoveTest, ServerWithNoShardsIsThePreferredTarget) {
  auto move = Pick({"a", "b", "c"}, {{"a", 8}, {"a", 1}, {"b", 1}});
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->from, "a");
  EXPECT_EQ(move->to, "c");
  EXPECT_DOUBLE_EQ(move->to_load, 0);
  EXPECT_EQ(move->shard, 0u);
}

TEST(PickShardMoveTest, OtherJobsAndOutOfRangeShardsAreIgnored) {
  const std::vector<Shard> shards = {{"a", 8}, {"a", 1}, {"b", 1}};
  v1::ShardMap map = Map({"a", "b"}, shards);
  v1::ShardAssignment* stray = map.add_assignments();  // Shard 3 of a 3-shard map.
  stray->set_shard(3);
  stray->set_primary("b");
  std::vector<v1::ShardLoad> loads = Loads(shards);
  loads.push_back(Load(2, 100 * kMiB, "other-job"));
  loads.push_back(Load(3, 100 * kMiB));
  auto move = PickShardMove(map, loads, {});
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->from, "a");
  EXPECT_EQ(move->to, "b");
  EXPECT_EQ(move->shard, 1u);
  EXPECT_DOUBLE_EQ(move->from_load, 9 * kMiB);
  EXPECT_DOUBLE_EQ(move->to_load, 1 * kMiB);
}

TEST(PickShardMoveTest, RepeatedReportsOfAShardAreSummed) {
  std::vector<Shard> shards = {{"a", 3}, {"a", 1}, {"b", 0}};
  std::vector<v1::ShardLoad> loads = Loads(shards);
  loads.push_back(Load(0, 3 * kMiB));
  auto move = PickShardMove(Map({"a", "b"}, shards), loads, {});
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->shard, 0u);
  EXPECT_DOUBLE_EQ(move->bytes_per_sec, 6 * kMiB);
  EXPECT_DOUBLE_EQ(move->from_load, 7 * kMiB);
}

TEST(PickShardMoveTest, AShardNeverGoesToAServerThatBacksIt) {
  // c is coldest and backs a's shard 1 only: shard 0 may go there, shard 1 may not.
  auto move = Pick({"a", "b", "c"}, {{"a", 8}, {"a", 1, {"c"}}, {"b", 1}});
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->to, "c");
  EXPECT_EQ(move->shard, 0u);
  // c backs the hot shard 0, which b cannot take (it would end at a's load): the coldest server
  // takes the shard it may hold.
  move = Pick({"a", "b", "c"}, {{"a", 8, {"c"}}, {"a", 1}, {"b", 1}});
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->to, "c");
  EXPECT_EQ(move->shard, 1u);
  // Replication 2 on three servers: b, the coldest, backs both of a's shards, so c takes one
  // (the one that leaves the lower maximum).
  move = Pick({"a", "b", "c"},
              {{"a", 4, {"b"}}, {"a", 3, {"b"}}, {"b", 0.5, {"c"}}, {"c", 1, {"a"}}});
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->to, "c");
  EXPECT_EQ(move->shard, 1u);
  // Two servers, each backing the other's every shard: nothing can move.
  EXPECT_EQ(Pick({"a", "b"}, {{"a", 8, {"b"}}, {"a", 1, {"b"}}, {"b", 1, {"a"}}}), std::nullopt);
}

TEST(PickShardMoveTest, BelowMinBytesPerSecNothingMoves) {
  const std::vector<Shard> shards = {{"a", 0.5}, {"a", 0.25}, {"b", 0}};  // 0.75 MiB/s apart.
  EXPECT_EQ(Pick({"a", "b"}, shards), std::nullopt);
  RebalanceOptions options;
  options.min_bytes_per_sec = 0.5 * kMiB;
  auto move = Pick({"a", "b"}, shards, options);
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->shard, 0u);
}

TEST(PickShardMoveTest, ImbalanceThresholdIsRespected) {
  // a = 6, b = 2, c = 1: mean 3, a is exactly twice the mean.
  const std::vector<Shard> shards = {{"a", 4}, {"a", 2}, {"b", 2}, {"c", 1}};
  RebalanceOptions options;
  options.imbalance = 2;
  EXPECT_EQ(Pick({"a", "b", "c"}, shards, options), std::nullopt);
  options.imbalance = 1.9;
  auto move = Pick({"a", "b", "c"}, shards, options);
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->to, "c");
  EXPECT_EQ(move->shard, 1u);  // max(4, 3) beats max(2, 5).
}

TEST(PickShardMoveTest, NonFiniteAndNegativeLoadsAreIgnored) {
  const std::vector<Shard> shards = {{"a", 8}, {"a", 1}, {"b", 1}};
  std::vector<v1::ShardLoad> loads = Loads(shards);
  loads.push_back(Load(2, std::numeric_limits<double>::quiet_NaN()));
  loads.push_back(Load(2, std::numeric_limits<double>::infinity()));
  loads.push_back(Load(1, -std::numeric_limits<double>::infinity()));
  loads.push_back(Load(0, -5 * kMiB));
  auto move = PickShardMove(Map({"a", "b"}, shards), loads, {});
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->shard, 1u);
  EXPECT_DOUBLE_EQ(move->from_load, 9 * kMiB);
  EXPECT_DOUBLE_EQ(move->to_load, 1 * kMiB);
  EXPECT_DOUBLE_EQ(move->bytes_per_sec, 1 * kMiB);
}

// A shard of many small requests (sparse rows) makes its server hot at few bytes/s: requests
// count as bytes_per_request each. With bytes_per_request = 0, bytes/s alone decide.
TEST(PickShardMoveTest, RequestsCountTowardsTheLoad) {
  auto map = Map({"a", "b"}, {{"a", 0}, {"a", 0}, {"b", 0}});
  std::vector<v1::ShardLoad> loads = {Load(0, 0.1 * kMiB), Load(1, 0.1 * kMiB),
                                      Load(2, 0.3 * kMiB)};
  loads[0].mutable_load()->set_requests_per_sec(200);
  loads[1].mutable_load()->set_requests_per_sec(100);
  RebalanceOptions o;
  o.bytes_per_request = 32 << 10;  // Shard 0: 0.1 MiB + 6.25 MiB; shard 1: 0.1 + 3.1.
  auto move = PickShardMove(map, loads, o);
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->from, "a");
  EXPECT_EQ(move->to, "b");
  EXPECT_EQ(move->shard, 1u) << "moving shard 0 would only swap the imbalance";
  EXPECT_NEAR(move->bytes_per_sec, 0.1 * kMiB + 100.0 * (32 << 10), 1);
  o.bytes_per_request = 0;
  EXPECT_FALSE(PickShardMove(map, loads, o).has_value()) << "0.2 MiB/s against 0.3";
  // A report with a bad request rate counts for nothing.
  loads[0].mutable_load()->set_requests_per_sec(std::numeric_limits<double>::quiet_NaN());
  loads[1].mutable_load()->set_requests_per_sec(-5);
  o.bytes_per_request = 32 << 10;
  EXPECT_FALSE(PickShardMove(map, loads, o).has_value());
}

TEST(PickShardMoveTest, FewerThanTwoServersGivesNullopt) {
  EXPECT_EQ(Pick({"a"}, {{"a", 100}, {"a", 1}}), std::nullopt);
  EXPECT_EQ(Pick({}, {}), std::nullopt);
}

}  // namespace
}  // namespace pscluster::scheduler
