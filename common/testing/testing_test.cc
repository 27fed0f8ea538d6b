#include <atomic>
#include <thread>

#include "absl/status/statusor.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait_for.h"
#include "gtest/gtest.h"

namespace pscluster::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(StatusMatchersTest, MatchCodeAndMessage) {
  const absl::Status nf = absl::NotFoundError("job job-7 is unknown");
  EXPECT_THAT(nf, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(nf, StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-7")));
  EXPECT_THAT(nf, Not(StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-8"))));
  EXPECT_THAT(nf, Not(StatusIs(absl::StatusCode::kInvalidArgument)));
  EXPECT_THAT(nf, Not(IsOk()));
  EXPECT_THAT(absl::OkStatus(), IsOk());

  absl::StatusOr<int> value = 3;
  EXPECT_THAT(value, IsOk());
  absl::StatusOr<int> error = absl::InvalidArgumentError("field x");
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x")));
}

TEST(WaitForTest, ReturnsOnceTheConditionHoldsAndFalseAtTheDeadline) {
  std::atomic<bool> flag{false};
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(30));
    flag = true;
  });
  EXPECT_TRUE(WaitFor(absl::Seconds(30), [&] { return flag.load(); }));
  t.join();
  int calls = 0;
  EXPECT_FALSE(WaitFor(absl::Milliseconds(50), [&] {
    ++calls;
    return false;
  }));
  EXPECT_GE(calls, 2);  // Polled, and checked once more at the deadline.
}

}  // namespace
}  // namespace pscluster::testing
