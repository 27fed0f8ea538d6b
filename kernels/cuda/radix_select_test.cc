// The CUDA top-k's digit selection (radix_select.h) run on the host the way one block of threads
// runs it: phase by phase with a barrier in between, threads inside a phase in ascending,
// descending or shuffled order. Any order the hardware may pick must give the same state; the
// adversarial case is the one that made a late reader pick a second digit. Runs without a GPU.
#include "kernels/cuda/radix_select.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace pscluster::kernels::radix {
namespace {

enum class Order { kAscending, kDescending, kShuffled };

// One RadixSelectDigitKernel launch. With `late_read`, each thread reads state.remaining in the
// last phase instead of before the first barrier (the order the kernel must not use).
void EmulateSelectDigit(int shift, TopKState* state, Order order, std::mt19937_64& rng,
                        bool late_read = false) {
  std::array<uint32_t, kRadixDigits> suffix{};
  std::array<DigitThread, kRadixDigits> regs{};
  std::vector<int> threads(kRadixDigits);
  auto phase = [&](auto&& body) {
    std::iota(threads.begin(), threads.end(), 0);
    if (order == Order::kDescending) std::reverse(threads.begin(), threads.end());
    if (order == Order::kShuffled) std::shuffle(threads.begin(), threads.end(), rng);
    for (int t : threads) body(t);
  };
  phase([&](int t) { DigitLoad(t, *state, suffix.data(), &regs[t]); });
  for (int step = 1; step < kRadixDigits; step <<= 1) {
    phase([&](int t) { DigitScanRead(t, step, suffix.data(), &regs[t]); });
    phase([&](int t) { DigitScanAdd(t, suffix.data(), regs[t]); });
  }
  phase([&](int t) {
    if (late_read) regs[t].remaining = state->remaining;
    DigitDecide(t, shift, suffix.data(), regs[t], state);
  });
}

TopKState Fresh(uint32_t k) {
  TopKState s;
  std::memset(&s, 0, sizeof(s));
  s.remaining = k;
  return s;
}

// The whole radix select (histogram kernel done on the host), as DoTopKAbs queues it.
TopKState EmulateSelect(const std::vector<float>& x, uint32_t k, Order order,
                        std::mt19937_64& rng) {
  TopKState s = Fresh(k);
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    std::fill(std::begin(s.hist), std::end(s.hist), 0u);
    for (float v : x) {
      const uint32_t key = AbsKey(v);
      if ((key & s.mask) == s.prefix) ++s.hist[(key >> shift) & 0xffu];
    }
    EmulateSelectDigit(shift, &s, order, rng);
  }
  return s;
}

constexpr Order kOrders[] = {Order::kAscending, Order::kDescending, Order::kShuffled};

TEST(RadixSelectTest, AdversarialDigitsPickOneDigitInEveryThreadOrder) {
  // 5 keys in digit 200, 10 in digit 100, k = 10: digit 100 holds the 10th largest key and 5 of
  // its keys remain to be taken. Digit 200 also "holds" rank 5, the remainder after the decision.
  std::mt19937_64 rng(1);
  for (int shift : {24, 16, 8, 0}) {
    for (Order order : kOrders) {
      for (int rep = 0; rep < (order == Order::kShuffled ? 50 : 1); ++rep) {
        TopKState s = Fresh(10);
        s.hist[200] = 5;
        s.hist[100] = 10;
        s.hist[3] = 1000;
        EmulateSelectDigit(shift, &s, order, rng);
        EXPECT_EQ(s.prefix, 100u << shift) << "shift " << shift;
        EXPECT_EQ(s.mask, 0xffu << shift);
        EXPECT_EQ(s.remaining, 5u);
      }
    }
  }
}

TEST(RadixSelectTest, ReadingRemainingAfterTheScanPicksASecondDigit) {
  // The order the kernel had before the fix: when the decider writes first, a later thread sees
  // remaining = 5 and digit 200 claims the rank too. The emulation must be able to show it.
  std::mt19937_64 rng(2);
  TopKState s = Fresh(10);
  s.hist[200] = 5;
  s.hist[100] = 10;
  EmulateSelectDigit(24, &s, Order::kAscending, rng, /*late_read=*/true);
  EXPECT_EQ(s.prefix, (100u | 200u) << 24);  // Top-k would then look for keys that don't exist.
}

TEST(RadixSelectTest, ExactlyOneDigitHoldsEachRank) {
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<uint32_t> count(0, 3);
  for (int rep = 0; rep < 20; ++rep) {
    std::array<uint32_t, kRadixDigits> suffix{};
    for (int t = 0; t < kRadixDigits; ++t) suffix[t] = rep % 2 == 0 ? count(rng) : (t % 37 == 0);
    for (int t = kRadixDigits - 2; t >= 0; --t) suffix[t] += suffix[t + 1];
    for (uint32_t remaining = 1; remaining <= suffix[0]; ++remaining) {
      int holders = 0;
      for (int t = 0; t < kRadixDigits; ++t) holders += DigitHoldsRank(t, suffix.data(), remaining);
      ASSERT_EQ(holders, 1) << "remaining " << remaining;
    }
  }
}

// The k-th largest key and how many keys equal to it the top k take.
void Expected(const std::vector<float>& x, uint32_t k, uint32_t* threshold, uint32_t* ties) {
  std::vector<uint32_t> keys(x.size());
  for (size_t i = 0; i < x.size(); ++i) keys[i] = AbsKey(x[i]);
  std::sort(keys.begin(), keys.end(), std::greater<uint32_t>());
  *threshold = keys[k - 1];
  *ties = static_cast<uint32_t>(std::count(keys.begin(), keys.begin() + k, *threshold));
}

TEST(RadixSelectTest, FourPassesFindTheKthLargestKey) {
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<float> uniform(-5.0f, 5.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> inputs;
  for (int n : {1, 7, 1000, 4096}) {
    std::vector<float> x(n);
    for (float& v : x) v = uniform(rng);
    inputs.push_back(x);
    for (float& v : x) v = std::round(v);  // Few magnitudes: many ties at the threshold.
    inputs.push_back(x);
  }
  // Keys that share their top bytes and split only in a lower digit (each pass decides with
  // digits on both sides), plus NaN, infinities and signed zeros.
  std::vector<float> crafted;
  for (uint32_t low : {200u, 100u}) {
    for (int i = 0; i < (low == 200u ? 5 : 10); ++i) {
      const uint32_t bits = 0x3f000000u | (low << 16) | (low << 8) | static_cast<uint32_t>(i);
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      crafted.push_back(i % 2 ? f : -f);
    }
  }
  for (float v : {nan, inf, -inf, 0.0f, -0.0f, 1.0f, -1.0f}) crafted.push_back(v);
  inputs.push_back(crafted);
  for (const std::vector<float>& x : inputs) {
    const uint32_t n = static_cast<uint32_t>(x.size());
    for (uint32_t k : {1u, std::max(1u, n / 3), (n + 1) / 2, n}) {
      uint32_t threshold, ties;
      Expected(x, k, &threshold, &ties);
      for (Order order : kOrders) {
        const TopKState s = EmulateSelect(x, k, order, rng);
        ASSERT_EQ(s.prefix, threshold) << "n=" << n << " k=" << k;
        ASSERT_EQ(s.mask, 0xffffffffu);
        ASSERT_EQ(s.remaining, ties) << "n=" << n << " k=" << k;
      }
    }
  }
}

}  // namespace
}  // namespace pscluster::kernels::radix
