#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
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
  std::atomic<int> arrived{0};
  std::atomic<bool> both_inside{false};
  // Each chunk waits (sleeping, so the other thread gets a core on a busy machine) until the
  // other chunk has started or 10 s have passed.
  pool.ParallelFor(2, 1, [&](int64_t, int64_t) {
    const bool first = arrived.fetch_add(1) == 0;
    for (int i = 0; i < 100000 && arrived.load() < 2; ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    // Run one after the other (one thread), the first chunk would time out alone.
    if (first && arrived.load() == 2) both_inside = true;
  });
  EXPECT_TRUE(both_inside.load());
}

}  // namespace
}  // namespace pscluster::kernels
