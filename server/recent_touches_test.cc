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
  // 990 touches of other keys make the window: every count halves and the doorkeeper forgets
  // (the first touch was its; the 9 others counted, halved to 4).
  for (uint64_t k = 0; k < 990; ++k) t.Add(1000000 + k);
  EXPECT_EQ(t.Estimate(42), 4u);
  // Counts saturate at 255 (plus the doorkeeper's one).
  for (int i = 0; i < 300; ++i) t.Add(7);
  EXPECT_LE(t.Estimate(7), 256u);
  EXPECT_GE(t.Estimate(7), 127u);  // 300 touches, a halving at most in between.
  EXPECT_EQ(t.bytes(), (4u << 16) + (4u << 16));  // Counters and the doorkeeper's bits.
}

TEST(RecentTouchesTest, KeysTouchedOnceLeaveTheCountersAlone) {
  // 4 x 2^12 counters and 2^17 doorkeeper bits; a window of 20,000 touches.
  RecentTouches t(/*log2_width=*/12, /*window=*/20000);
  for (int i = 0; i < 6; ++i) t.Add(5);
  // 15,000 keys touched once each: without the doorkeeper about 3.7 touches a counter, enough
  // to raise most keys' estimate above 1 and key 5's above 6.
  for (uint64_t k = 0; k < 15000; ++k) EXPECT_GE(t.Add(1000000 + k), 1u);
  int overcounted = 0;
  for (uint64_t k = 0; k < 15000; ++k) overcounted += t.Estimate(1000000 + k) > 1;
  EXPECT_LT(overcounted, 150) << "keys touched once are seen once, but for a few collisions";
  EXPECT_EQ(t.Estimate(5), 6u);
  EXPECT_EQ(t.Estimate(777), 0u);
  // The window ends: the doorkeeper empties, the counts halve (5 after its first touch: 2).
  for (uint64_t k = 0; k < 5000 - 6; ++k) t.Add(2000000 + k);
  EXPECT_EQ(t.Estimate(1000000), 0u);
  EXPECT_EQ(t.Estimate(5), 2u);
  EXPECT_EQ(t.Add(5), 3u);  // A first touch of the window again: the doorkeeper's.
  EXPECT_EQ(t.Add(5), 4u);
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
