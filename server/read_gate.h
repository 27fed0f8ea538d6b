// When a pull may be served: the consistency policy (BSP, SSP with a staleness bound, ASP) and
// the pulls parked until the slowest clock lets them through.
//
// A read at clock c needs the slowest rank's clock to reach NeedFor(c): c under BSP, c - s
// under SSP(s), nothing under ASP. The gate lets through every read whose need is at most the
// released clock, which its owner raises once the updates of the steps below it are in place
// (an aggregate step applied, a periodic checkpoint taken).
//
// Thread model: not thread-safe; its owner (Job) guards it with its clock lock. Callbacks are
// never run here: they are handed back to be run once no lock is held. No I/O.
#ifndef PSCLUSTER_SERVER_READ_GATE_H_
#define PSCLUSTER_SERVER_READ_GATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "proto/ps.pb.h"

namespace pscluster {

class ReadGate {
 public:
  using Callback = std::function<void(absl::Status)>;

  explicit ReadGate(v1::ConsistencySpec consistency) : consistency_(std::move(consistency)) {}

  // The slowest clock a read at `clock` needs.
  int64_t NeedFor(int64_t clock) const;
  // Reads that need at most this are served at once.
  int64_t released() const { return released_; }
  bool Admits(int64_t clock) const { return NeedFor(clock) <= released_; }

  // A read at `clock` by a rank that has just pushed the last of its step `step` (its clock is
  // `own_clock`), while the slowest of the other ranks is at `others`: whether it may be served
  // now, without waiting for the released clock. Sets *reflects to the slowest clock the read
  // then reflects. Never under aggregation (updates land only when a step completes
  // everywhere).
  bool AdmitsAfterOwnPush(int64_t clock, int64_t step, int64_t own_clock, int64_t others,
                          int64_t* reflects) const;

  // Parks a read at `clock` until the released clock admits it; returns its id.
  uint64_t Park(int64_t clock, Callback ready);
  // Forgets a parked read (its callback will not be called). False if it is not parked.
  bool Cancel(uint64_t id);
  // Raises the released clock to `min` (never lowers it) and hands the callbacks of the reads
  // it now admits to *ready, in order of what they need.
  void Release(int64_t min, std::vector<Callback>* ready);
  // Lowers the released clock to at most `min` (a copy with slower clocks joined).
  void Lower(int64_t min);
  // Sets the released clock to `min` with nothing parked changed (a restore, a rewind).
  void Reset(int64_t min) { released_ = min; }
  // Hands every parked read's callback over (a map change, a drop): none stays parked.
  std::vector<Callback> TakeAll();

  size_t parked() const { return waiters_.size(); }
  // The most that a parked read needs (INT64_MIN when none is parked).
  int64_t MaxParkedNeed() const;

  // Staleness of served reads: how far the reader's clock was ahead of what the read reflected.
  void RecordServed(int64_t reader_clock, int64_t reflected);
  double mean_staleness() const { return count_ ? sum_ / static_cast<double>(count_) : 0.0; }
  int64_t max_staleness() const { return max_; }

 private:
  struct Waiter {
    int64_t need = 0;
    Callback ready;
  };

  const v1::ConsistencySpec consistency_;
  int64_t released_ = 0;
  std::multimap<int64_t, uint64_t> by_need_;
  absl::flat_hash_map<uint64_t, Waiter> waiters_;
  uint64_t next_id_ = 1;
  double sum_ = 0;
  uint64_t count_ = 0;
  int64_t max_ = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_READ_GATE_H_
