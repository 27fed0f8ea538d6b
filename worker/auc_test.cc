#include "worker/auc.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace pscluster::worker {
namespace {

TEST(AucTest, PerfectReversedAndTiedRankings) {
  AucAccumulator perfect;
  for (int i = 0; i < 10; ++i) perfect.Add(static_cast<float>(i), i >= 5 ? 1 : 0);
  EXPECT_DOUBLE_EQ(perfect.Auc(), 1.0);
  AucAccumulator reversed;
  for (int i = 0; i < 10; ++i) reversed.Add(static_cast<float>(i), i < 5 ? 1 : 0);
  EXPECT_DOUBLE_EQ(reversed.Auc(), 0.0);
  AucAccumulator tied;  // Every score equal: each pair counts one half.
  for (int i = 0; i < 7; ++i) tied.Add(0.5f, i % 3 == 0 ? 1 : 0);
  EXPECT_DOUBLE_EQ(tied.Auc(), 0.5);
}

TEST(AucTest, OneClassOrNanHasNoAuc) {
  AucAccumulator one;
  one.Add(0.1f, 1);
  one.Add(0.2f, 1);
  EXPECT_EQ(one.Auc(), -1);
  AucAccumulator nan;
  nan.Add(0.1f, 1);
  nan.Add(std::nanf(""), 0);
  EXPECT_EQ(nan.Auc(), -1);
  EXPECT_EQ(AucAccumulator().Auc(), -1);
}

// Against the definition: the share of (positive, negative) pairs ordered right, ties one half.
TEST(AucTest, MatchesThePairwiseDefinition) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> score(0, 20), label(0, 1);  // Many ties.
  std::vector<std::pair<float, int>> examples;
  AucAccumulator acc;
  for (int i = 0; i < 500; ++i) {
    examples.push_back({static_cast<float>(score(rng)), label(rng)});
    acc.Add(examples.back().first, examples.back().second);
  }
  double right = 0, pairs = 0;
  for (const auto& p : examples) {
    for (const auto& q : examples) {
      if (p.second != 1 || q.second != 0) continue;
      pairs += 1;
      right += p.first > q.first ? 1.0 : p.first == q.first ? 0.5 : 0.0;
    }
  }
  EXPECT_NEAR(acc.Auc(), right / pairs, 1e-12);
}

}  // namespace
}  // namespace pscluster::worker
