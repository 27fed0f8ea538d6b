// WaitFor: polls a condition until it holds or a deadline passes. For tests that wait on
// another thread or process (a daemon's state, a file, a job's progress) where nothing can be
// waited on directly; a test that owns both sides synchronises explicitly instead.
#ifndef PSCLUSTER_COMMON_TESTING_WAIT_FOR_H_
#define PSCLUSTER_COMMON_TESTING_WAIT_FOR_H_

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pscluster::testing {

// True as soon as `done()` is; false if it still is not after `timeout` (checked once more at
// the deadline). Polls every `poll`.
inline bool WaitFor(absl::Duration timeout, const std::function<bool()>& done,
                    absl::Duration poll = absl::Milliseconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(poll);
  }
  return done();
}

}  // namespace pscluster::testing

#endif  // PSCLUSTER_COMMON_TESTING_WAIT_FOR_H_
