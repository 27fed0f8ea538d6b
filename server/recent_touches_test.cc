#include "server/recent_touches.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(RecentTouchesTest, CountsTouchesAndForgetsHalfOfThemEachWindow) {
  RecentTouches t(/*log2_width=*/16, /*window=*/1000);
  EXPECT_EQ(t.Estimate(42), 0u);
  EXPECT_EQ(t.Add(42), 1u);
  EXPECT_EQ(t.Add(42), 2u);
  for (int i = 0; i < 8; ++i) t.Add(42);
  EXPECT_EQ(t.Estimate(42), 10u);
  // 990 touches of other keys make the window: every count halves.
  for (uint64_t k = 0; k < 990; ++k) t.Add(1000000 + k);
  EXPECT_EQ(t.Estimate(42), 5u);
  // Counts saturate at 255.
  for (int i = 0; i < 300; ++i) t.Add(7);
  EXPECT_LE(t.Estimate(7), 255u);
  EXPECT_GE(t.Estimate(7), 127u);  // 300 touches, a halving at most in between.
  EXPECT_EQ(t.bytes(), 4u << 16);
}

TEST(RecentTouchesTest, AKeyTouchedOnceIsSeenOnceAmongMany) {
  RecentTouches t(/*log2_width=*/20);
  for (uint64_t k = 0; k < 100000; ++k) t.Add(k * 7919);
  int overcounted = 0;
  for (uint64_t k = 0; k < 100000; ++k) overcounted += t.Estimate(k * 7919) > 1;
  EXPECT_LT(overcounted, 100) << "4 x 2^20 counters for 10^5 keys: few collide in every row";
}

TEST(RecentTouchesTest, ThreadsCountTogether) {
  RecentTouches t(/*log2_width=*/12, /*window=*/uint64_t{1} << 40);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 50; ++j) t.Add(99);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(t.Estimate(99), 200u);
}

}  // namespace
}  // namespace pscluster
