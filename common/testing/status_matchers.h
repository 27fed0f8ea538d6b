// StatusIs(code), StatusIs(code, HasSubstr(...)) and IsOk() for absl::Status and
// absl::StatusOr<T>: tests assert the exact error code and what the message names, e.g.
//   EXPECT_THAT(store.Put(...), StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-7")));
#ifndef PSCLUSTER_COMMON_TESTING_STATUS_MATCHERS_H_
#define PSCLUSTER_COMMON_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace pscluster::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER_P2(StatusIs, code, message_matcher,
           std::string("has code ") + absl::StatusCodeToString(code)) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  if (s.code() != code) return false;
  return ::testing::ExplainMatchResult(message_matcher, std::string(s.message()),
                                       result_listener);
}

MATCHER_P(StatusIs, code, std::string("has code ") + absl::StatusCodeToString(code)) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code;
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.ok();
}

}  // namespace pscluster::testing

#endif  // PSCLUSTER_COMMON_TESTING_STATUS_MATCHERS_H_
