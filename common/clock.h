// The passage of time, injected so that leases, rates and timeouts can be tested with a fake.
#ifndef PSCLUSTER_COMMON_CLOCK_H_
#define PSCLUSTER_COMMON_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pscluster {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// Wall-clock time.
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1700000000)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_CLOCK_H_
