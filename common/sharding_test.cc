#include "common/sharding.h"

#include <gtest/gtest.h>

#include <vector>

namespace pscluster {
namespace {

// Servers and workers in different processes (and builds) must route identically: these values
// are pinned so that a change of the hash is caught, since it would silently misroute data
// between daemons of different versions.
TEST(ShardingTest, HashIsPinned) {
  EXPECT_EQ(TableHash(""), Mix64(0xcbf29ce484222325ULL));
  EXPECT_EQ(Mix64(0), 0xe220a8397b1dcdafULL);  // splitmix64's first output for seed 0.
  uint64_t h = TableHash("fc1/weight");
  EXPECT_EQ(ShardOfBlock(h, 3, 64), ShardOfBlock(TableHash("fc1/weight"), 3, 64));
}

TEST(ShardingTest, BlocksAndKeysSpreadEvenly) {
  constexpr uint32_t kShards = 64;
  uint64_t h = TableHash("embedding");
  std::vector<int> blocks(kShards), keys(kShards);
  constexpr int kN = 64000;
  for (int i = 0; i < kN; ++i) {
    ++blocks[ShardOfBlock(h, i, kShards)];
    ++keys[ShardOfKey(h, static_cast<uint64_t>(i) * 7919, kShards)];
  }
  for (uint32_t s = 0; s < kShards; ++s) {
    // Expected 1000 each; a fair hash stays well within +-20%.
    EXPECT_GT(blocks[s], 800) << s;
    EXPECT_LT(blocks[s], 1200) << s;
    EXPECT_GT(keys[s], 800) << s;
    EXPECT_LT(keys[s], 1200) << s;
  }
}

TEST(ShardingTest, DifferentTablesLandDifferently) {
  int same = 0;
  for (int b = 0; b < 1000; ++b) {
    same += ShardOfBlock(TableHash("a"), b, 64) == ShardOfBlock(TableHash("b"), b, 64);
  }
  EXPECT_LT(same, 60);  // ~1000/64 expected by chance.
}

TEST(ShardingTest, NumBlocks) {
  EXPECT_EQ(NumBlocks(0, 10), 0u);
  EXPECT_EQ(NumBlocks(10, 10), 1u);
  EXPECT_EQ(NumBlocks(11, 10), 2u);
}

}  // namespace
}  // namespace pscluster
