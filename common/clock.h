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
  // Waits `d` of this clock's time (a wait that polls another daemon, a grace period).
  virtual void SleepFor(absl::Duration d) const = 0;
  // Waits until Now() >= t.
  void SleepUntil(absl::Time t) const {
    const absl::Time now = Now();
    if (t > now) SleepFor(t - now);
  }
};

// Wall-clock time.
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  void SleepFor(absl::Duration d) const override { absl::SleepFor(d); }
};

// A clock that moves only when told to, or by what sleeps on it: SleepFor(d) moves it by d at
// once (after a millisecond of real time, so that other threads run), so waits in the code
// under test take fake time, not real time. Thread-safe.
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
  void SleepFor(absl::Duration d) const override {
    absl::SleepFor(absl::Milliseconds(1));
    absl::MutexLock l(&mu_);
    if (d > absl::ZeroDuration()) now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_CLOCK_H_
