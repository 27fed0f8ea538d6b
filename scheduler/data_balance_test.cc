#include "scheduler/data_balance.h"

#include <gtest/gtest.h>

#include <limits>

namespace pscluster::scheduler {
namespace {

TEST(DataBalanceTest, SharesFollowTheComputeRates) {
  auto s = PickDataShares({3000, 1000}, {});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, (std::vector<uint32_t>{1500, 500}));
  // Three ranks, one twice as fast as the others.
  s = PickDataShares({2000, 1000, 1000}, {});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, (std::vector<uint32_t>{1500, 750, 750}));
}

TEST(DataBalanceTest, NoChangeWithinTolerance) {
  // Equal parts, rates 10% apart: left alone.
  EXPECT_FALSE(PickDataShares({1100, 1000}, {}).has_value());
  // Shares already match the rates (a rank that got a larger part measures the same rate).
  EXPECT_FALSE(PickDataShares({3050, 1000}, {1500, 500}).has_value());
  // The slow rank sped up: back towards equal parts.
  auto s = PickDataShares({1000, 1000}, {1500, 500});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, (std::vector<uint32_t>{1000, 1000}));
  // A tighter tolerance acts on the 10%.
  DataBalanceOptions tight;
  tight.tolerance = 0.02;
  EXPECT_TRUE(PickDataShares({1100, 1000}, {}, tight).has_value());
}

TEST(DataBalanceTest, SharesAreClampedToTheSkew) {
  // A nearly stalled rank still reads a quarter of an equal part.
  auto s = PickDataShares({1e6, 1}, {});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, (std::vector<uint32_t>{2000, 250}));
  // One very fast rank of eight reads at most four equal parts.
  s = PickDataShares({1e6, 1, 1, 1, 1, 1, 1, 1}, {});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ((*s)[0], 4000u);
  EXPECT_EQ((*s)[7], 250u);
  DataBalanceOptions wide;
  wide.max_skew = 100;
  s = PickDataShares({1e6, 1}, {}, wide);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, (std::vector<uint32_t>{2000, 10}));
}

TEST(DataBalanceTest, MissingOrBadRatesChangeNothing) {
  EXPECT_FALSE(PickDataShares({1000}, {}).has_value()) << "one rank";
  EXPECT_FALSE(PickDataShares({}, {}).has_value());
  EXPECT_FALSE(PickDataShares({3000, 0}, {}).has_value()) << "not measured yet";
  EXPECT_FALSE(PickDataShares({3000, -1}, {}).has_value());
  EXPECT_FALSE(PickDataShares({3000, std::numeric_limits<double>::infinity()}, {}).has_value());
  EXPECT_FALSE(PickDataShares({3000, std::numeric_limits<double>::quiet_NaN()}, {}).has_value());
  EXPECT_FALSE(PickDataShares({3000, 1000}, {1000, 1000, 1000}).has_value()) << "wrong size";
}

}  // namespace
}  // namespace pscluster::scheduler
