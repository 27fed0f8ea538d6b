#include "common/scheduler_term.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

TEST(SchedulerTermFenceTest, ALowerTermIsRefusedOnceAHigherOneWasSeen) {
  SchedulerTermFence fence;
  EXPECT_EQ(fence.term(), 0);
  EXPECT_TRUE(fence.AdmitTerm(7, "m").ok());
  EXPECT_TRUE(fence.AdmitTerm(7, "m").ok());  // The same leader again.
  EXPECT_EQ(fence.term(), 7);
  absl::Status s = fence.AdmitTerm(5, "pscluster.v1.ParameterServer.DropJob");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("pscluster.v1.ParameterServer.DropJob"));
  EXPECT_THAT(s.message(), HasSubstr("deposed scheduler (term 5)"));
  EXPECT_THAT(s.message(), HasSubstr("term 7 leads"));
  EXPECT_EQ(fence.term(), 7);  // Unchanged by the refusal.
  EXPECT_EQ(fence.refused(), 1);
  EXPECT_TRUE(fence.AdmitTerm(12, "m").ok());  // A later leader.
  EXPECT_EQ(fence.AdmitTerm(7, "m").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fence.refused(), 2);
}

TEST(SchedulerTermFenceTest, ACallWithoutATermIsNeitherCheckedNorCounted) {
  SchedulerTermFence fence;
  EXPECT_TRUE(fence.AdmitTerm(9, "m").ok());
  EXPECT_TRUE(fence.AdmitTerm(0, "m").ok());
  EXPECT_EQ(fence.term(), 9);
  EXPECT_EQ(fence.refused(), 0);
}

TEST(SchedulerTermFenceTest, ConcurrentCallsEndAtTheHighestTerm) {
  SchedulerTermFence fence;
  std::vector<std::thread> threads;
  for (int t = 1; t <= 8; ++t) {
    threads.emplace_back([&fence, t] {
      for (int i = 0; i < 1000; ++i) (void)fence.AdmitTerm(t * 1000 + i, "m");
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(fence.term(), 8999);
}

}  // namespace
}  // namespace pscluster
