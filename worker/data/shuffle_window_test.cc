#include "worker/data/shuffle_window.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace pscluster::data {
namespace {

// Pushes examples labelled 0..n-1 and drains; returns the labels in output order.
std::vector<int> Shuffled(size_t capacity, uint64_t seed, int n) {
  ShuffleWindow w(capacity, seed);
  std::vector<int> out;
  Example e;
  for (int i = 0; i < n; ++i) {
    e.Clear();
    e.label = i;
    e.keys.assign(static_cast<size_t>(i % 5), static_cast<uint64_t>(i));
    if (w.Push(&e)) {
      EXPECT_EQ(e.keys, std::vector<uint64_t>(static_cast<size_t>(e.label % 5), e.label));
      out.push_back(e.label);
    }
  }
  EXPECT_LE(w.size(), std::max<size_t>(capacity, 1));
  while (w.Drain(&e)) {
    EXPECT_EQ(e.keys, std::vector<uint64_t>(static_cast<size_t>(e.label % 5), e.label));
    out.push_back(e.label);
  }
  return out;
}

TEST(ShuffleWindowTest, EveryExampleComesOutOnce) {
  for (size_t cap : {2, 10, 1000, 5000}) {
    std::vector<int> out = Shuffled(cap, 1, 3000);
    std::vector<int> sorted = out;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> want(3000);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(sorted, want) << cap;
    EXPECT_NE(out, want) << cap;
  }
}

TEST(ShuffleWindowTest, WindowOfOneOrZeroKeepsTheOrder) {
  std::vector<int> want(100);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(Shuffled(0, 1, 100), want);
  EXPECT_EQ(Shuffled(1, 1, 100), want);
}

TEST(ShuffleWindowTest, DeterministicBySeed) {
  EXPECT_EQ(Shuffled(100, 5, 2000), Shuffled(100, 5, 2000));
  EXPECT_NE(Shuffled(100, 5, 2000), Shuffled(100, 6, 2000));
}

// An example never comes out before `capacity` - 1 later ones went in: the output at position p
// is one of the first p + capacity inputs; and the window mixes across its whole width.
TEST(ShuffleWindowTest, OutputsComeFromTheWindow) {
  const size_t cap = 64;
  std::vector<int> out = Shuffled(cap, 9, 5000);
  int max_jump = 0;
  for (size_t p = 0; p < out.size(); ++p) {
    EXPECT_LT(static_cast<size_t>(out[p]), p + cap);
    max_jump = std::max(max_jump, out[p] - static_cast<int>(p));
  }
  EXPECT_GT(max_jump, static_cast<int>(cap) / 2);
}

}  // namespace
}  // namespace pscluster::data
