#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <vector>

#include <gtest/gtest.h>

namespace pscluster::kernels {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 7, 1000, 100003}) {
      for (int64_t grain : {1, 16, 5000}) {
        std::vector<std::atomic<int>> hits(n);
        pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
          ASSERT_LT(b, e);
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
      }
    }
  }
}

TEST(ThreadPoolTest, ManyBackToBackLoopsAndNestedCallsRunInline) {
  ThreadPool pool(4);
  std::atomic<int64_t> total{0};
  for (int round = 0; round < 2000; ++round) {
    pool.ParallelFor(64, 1, [&](int64_t b, int64_t e) {
      // A nested loop runs on the calling thread instead of deadlocking.
      pool.ParallelFor(e - b, 1, [&](int64_t nb, int64_t ne) { total.fetch_add(ne - nb); });
    });
  }
  EXPECT_EQ(total.load(), 2000 * 64);
}

TEST(ThreadPoolTest, UsesMoreThanOneThread) {
  ThreadPool pool(2);
  std::atomic<int> inside{0}, max_inside{0};
  // Each chunk waits until both threads are inside or a long time has passed.
  pool.ParallelFor(2, 1, [&](int64_t, int64_t) {
    int now = inside.fetch_add(1) + 1;
    int prev = max_inside.load();
    while (now > prev && !max_inside.compare_exchange_weak(prev, now)) {
    }
    for (int i = 0; i < 2000000 && inside.load() < 2; ++i) std::this_thread::yield();
    inside.fetch_sub(1);
  });
  EXPECT_EQ(max_inside.load(), 2);
}

}  // namespace
}  // namespace pscluster::kernels
