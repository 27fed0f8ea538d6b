#include "scheduler/job_state.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/status_matchers.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::HasSubstr;

TEST(JobStateTest, LifecycleEdges) {
  const v1::JobState all[] = {v1::JOB_QUEUED,    v1::JOB_PLACING, v1::JOB_RUNNING,
                              v1::JOB_SUCCEEDED, v1::JOB_FAILED,  v1::JOB_CANCELLED,
                              v1::JOB_RECOVERING};
  const std::set<std::pair<v1::JobState, v1::JobState>> allowed = {
      {v1::JOB_QUEUED, v1::JOB_PLACING},   {v1::JOB_QUEUED, v1::JOB_CANCELLED},
      {v1::JOB_QUEUED, v1::JOB_FAILED},    {v1::JOB_PLACING, v1::JOB_RUNNING},
      {v1::JOB_PLACING, v1::JOB_QUEUED},   {v1::JOB_PLACING, v1::JOB_FAILED},
      {v1::JOB_PLACING, v1::JOB_CANCELLED}, {v1::JOB_RUNNING, v1::JOB_SUCCEEDED},
      {v1::JOB_RUNNING, v1::JOB_FAILED},   {v1::JOB_RUNNING, v1::JOB_CANCELLED},
      {v1::JOB_RUNNING, v1::JOB_RECOVERING}, {v1::JOB_RECOVERING, v1::JOB_QUEUED},
      {v1::JOB_RECOVERING, v1::JOB_FAILED}, {v1::JOB_RECOVERING, v1::JOB_CANCELLED}};
  for (v1::JobState from : all) {
    for (v1::JobState to : all) {
      absl::Status s = CheckTransition(from, to);
      if (allowed.count({from, to})) {
        EXPECT_THAT(s, IsOk()) << JobStateName(from) << " -> " << JobStateName(to);
      } else {
        EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr(JobStateName(from) + " to " + JobStateName(to))));
      }
    }
  }
  EXPECT_THAT(CheckTransition(v1::JOB_SUCCEEDED, v1::JOB_CANCELLED),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already finished")));
}

TEST(JobStateTest, Predicates) {
  EXPECT_TRUE(IsTerminal(v1::JOB_CANCELLED));
  EXPECT_FALSE(IsTerminal(v1::JOB_RUNNING));
  EXPECT_TRUE(IsActive(v1::JOB_QUEUED));
  EXPECT_FALSE(HoldsResources(v1::JOB_QUEUED));
  EXPECT_TRUE(HoldsResources(v1::JOB_PLACING));
  // A recovering job keeps its old nodes until their tasks have stopped.
  EXPECT_TRUE(HoldsResources(v1::JOB_RECOVERING));
  EXPECT_TRUE(IsActive(v1::JOB_RECOVERING));
  EXPECT_FALSE(IsTerminal(v1::JOB_RECOVERING));
  EXPECT_EQ(JobStateName(v1::JOB_RECOVERING), "recovering");
  EXPECT_EQ(JobStateName(v1::JOB_SUCCEEDED), "succeeded");
}

}  // namespace
}  // namespace pscluster::scheduler
