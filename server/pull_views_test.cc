#include "server/pull_views.h"

#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/grad_compress.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

// What a worker holds of one block, kept as PsClient's mirror keeps it.
struct Worker {
  std::vector<float> held;
  uint64_t view = 0;

  void Apply(const PullViews::Reply& r, v1::DataType dtype) {
    const size_t es = DTypeSize(dtype);
    if (r.indices.empty()) {
      held.resize(r.values.size() / es);
      DecodeFloats(r.values.data(), held.size(), dtype, held.data());
    } else {
      const size_t count = r.indices.size() / 4;
      std::vector<float> v(count);
      DecodeFloats(r.values.data(), count, dtype, v.data());
      for (size_t i = 0; i < count; ++i) {
        uint32_t at;
        std::memcpy(&at, r.indices.data() + 4 * i, 4);
        held[at] = v[i];
      }
    }
    view = r.view;
  }
  uint64_t Asking() const { return view != 0 ? view : kPullViewStart; }
};

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(PullViewsTest, AViewedPullSendsWhatMovedMostAndTheRestLater) {
  MemoryBudget budget(0);
  PullViews views(&budget);
  constexpr uint64_t n = 1000;
  std::vector<float> w = Random(n, 1);
  Worker worker;
  // The first pull is whole, and starts a view.
  PullViews::Reply first = views.Encode(0, 0, 7, worker.Asking(), w.data(), n, v1::DT_FLOAT32,
                                        0.05f);
  EXPECT_TRUE(first.indices.empty());
  EXPECT_NE(first.view, 0u);
  worker.Apply(first, v1::DT_FLOAT32);
  EXPECT_EQ(worker.held, w);
  EXPECT_EQ(views.bytes(), n * 4);
  EXPECT_EQ(budget.used(), n * 4);

  // The weights move; the next pull sends the 50 that moved most, at their new values.
  std::vector<float> before = w;
  std::vector<float> step = Random(n, 2);
  for (uint64_t i = 0; i < n; ++i) w[i] += 0.01f * step[i] * (i % 3 == 0 ? 10.f : 1.f);
  std::vector<float> moved(n);
  for (uint64_t i = 0; i < n; ++i) moved[i] = w[i] - before[i];
  const std::vector<uint32_t> want = SelectTopK(moved.data(), n, 50);
  PullViews::Reply r = views.Encode(0, 0, 7, worker.Asking(), w.data(), n, v1::DT_FLOAT32, 0.05f);
  ASSERT_EQ(r.indices.size(), 50u * 4);
  ASSERT_EQ(r.values.size(), 50u * 4);
  EXPECT_EQ(std::memcmp(r.indices.data(), want.data(), r.indices.size()), 0);
  EXPECT_NE(r.view, first.view);
  worker.Apply(r, v1::DT_FLOAT32);
  for (uint32_t i : want) EXPECT_EQ(worker.held[i], w[i]);
  // With the weights still, the rest arrives within n / k pulls, and then the worker holds them
  // exactly.
  for (int i = 0; i < 19; ++i) {
    worker.Apply(views.Encode(0, 0, 7, worker.Asking(), w.data(), n, v1::DT_FLOAT32, 0.05f),
                 v1::DT_FLOAT32);
  }
  EXPECT_EQ(worker.held, w);
}

TEST(PullViewsTest, AnUnknownViewGetsTheWholeBlockAndAPlainPullKeepsNone) {
  MemoryBudget budget(0);
  PullViews views(&budget);
  constexpr uint64_t n = 300;
  std::vector<float> w = Random(n, 3);
  Worker a;
  a.Apply(views.Encode(1, 0, 0, a.Asking(), w.data(), n, v1::DT_FLOAT32, 0.1f), v1::DT_FLOAT32);
  for (float& x : w) x *= 1.5f;
  // A new task of the same rank (nothing held) starts again: whole, a new view.
  Worker b;
  PullViews::Reply rb = views.Encode(1, 0, 0, b.Asking(), w.data(), n, v1::DT_FLOAT32, 0.1f);
  EXPECT_TRUE(rb.indices.empty());
  b.Apply(rb, v1::DT_FLOAT32);
  EXPECT_EQ(b.held, w);
  // The old task's view is gone: its next pull is whole too, and right.
  PullViews::Reply ra = views.Encode(1, 0, 0, a.Asking(), w.data(), n, v1::DT_FLOAT32, 0.1f);
  EXPECT_TRUE(ra.indices.empty());
  a.Apply(ra, v1::DT_FLOAT32);
  EXPECT_EQ(a.held, w);
  // Another worker's views are its own; a plain pull (held 0) is whole and keeps nothing.
  PullViews::Reply plain = views.Encode(2, 0, 0, 0, w.data(), n, v1::DT_FLOAT32, 0.1f);
  EXPECT_TRUE(plain.indices.empty());
  EXPECT_EQ(plain.view, 0u);
  EXPECT_EQ(views.bytes(), n * 4) << "one view: worker 1's";
}

TEST(PullViewsTest, Float16ViewsHoldWhatTheWorkerDecodes) {
  MemoryBudget budget(0);
  PullViews views(&budget);
  constexpr uint64_t n = 512;
  std::vector<float> w = Random(n, 4);
  Worker worker;
  worker.Apply(views.Encode(0, 1, 2, worker.Asking(), w.data(), n, v1::DT_FLOAT16, 0.25f),
               v1::DT_FLOAT16);
  // The view holds the values as rounded to float16, as the worker has them.
  std::vector<uint16_t> half(n);
  EncodeFloats(w.data(), n, v1::DT_FLOAT16, half.data());
  std::vector<float> rounded(n);
  DecodeFloats(half.data(), n, v1::DT_FLOAT16, rounded.data());
  EXPECT_EQ(worker.held, rounded);
  // Every element moves by far more than its rounding: four pulls of a quarter each send every
  // one, and the worker then holds each new value, rounded.
  for (float& x : w) x += 0.125f;
  for (int i = 0; i < 4; ++i) {
    worker.Apply(views.Encode(0, 1, 2, worker.Asking(), w.data(), n, v1::DT_FLOAT16, 0.25f),
                 v1::DT_FLOAT16);
  }
  EncodeFloats(w.data(), n, v1::DT_FLOAT16, half.data());
  DecodeFloats(half.data(), n, v1::DT_FLOAT16, rounded.data());
  EXPECT_EQ(worker.held, rounded);
}

TEST(PullViewsTest, ViewsAreChargedToTheBudgetAndDroppedWithTheirBlocks) {
  MemoryBudget budget(10 * 4 * 100);  // Room for ten views of 100 elements.
  {
    PullViews views(&budget);
    std::vector<float> w = Random(100, 5);
    for (uint64_t block = 0; block < 12; ++block) {
      PullViews::Reply r =
          views.Encode(0, 0, block, kPullViewStart, w.data(), 100, v1::DT_FLOAT32, 0.1f);
      EXPECT_TRUE(r.indices.empty());
      EXPECT_EQ(r.view != 0, block < 10) << "block " << block << ": no room for its view";
    }
    EXPECT_EQ(budget.used(), 10u * 400);
    views.DropUnless([](uint32_t, uint64_t block) { return block % 2 == 0; });
    EXPECT_EQ(views.bytes(), 5u * 400);
    EXPECT_EQ(budget.used(), 5u * 400);
    (void)views.Encode(3, 0, 0, kPullViewStart, w.data(), 100, v1::DT_FLOAT32, 0.1f);
    EXPECT_EQ(views.bytes(), 6u * 400);
    views.DropWorker(0);  // Worker 0 left: only worker 3's view stays.
    EXPECT_EQ(views.bytes(), 400u);
    EXPECT_EQ(budget.used(), 400u);
  }
  EXPECT_EQ(budget.used(), 0u) << "released when the views go";
}

}  // namespace
}  // namespace pscluster
