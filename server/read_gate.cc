#include "server/read_gate.h"

#include <algorithm>
#include <limits>

namespace pscluster {

int64_t ReadGate::NeedFor(int64_t clock) const {
  switch (consistency_.mode()) {
    case v1::ConsistencySpec::ASP:
      return std::numeric_limits<int64_t>::min();
    case v1::ConsistencySpec::SSP:
      return clock - static_cast<int64_t>(consistency_.staleness());
    default:
      return clock;
  }
}

bool ReadGate::AdmitsAfterOwnPush(int64_t clock, int64_t step, int64_t own_clock,
                                  int64_t others, int64_t* reflects) const {
  if (consistency_.aggregate()) return false;
  const int64_t need = NeedFor(clock);
  if (step + 1 < need) return false;  // The reader's own earlier steps would not be in.
  if (others < need) return false;
  *reflects = std::min(others, std::max(own_clock, step + 1));
  return true;
}

uint64_t ReadGate::Park(int64_t clock, Callback ready) {
  const int64_t need = NeedFor(clock);
  const uint64_t id = next_id_++;
  waiters_[id] = Waiter{need, std::move(ready)};
  by_need_.emplace(need, id);
  return id;
}

bool ReadGate::Cancel(uint64_t id) { return waiters_.erase(id) > 0; }

void ReadGate::Release(int64_t min, std::vector<Callback>* ready) {
  released_ = std::max(released_, min);
  while (!by_need_.empty() && by_need_.begin()->first <= released_) {
    auto it = waiters_.find(by_need_.begin()->second);
    if (it != waiters_.end()) {
      ready->push_back(std::move(it->second.ready));
      waiters_.erase(it);
    }
    by_need_.erase(by_need_.begin());
  }
}

void ReadGate::Lower(int64_t min) { released_ = std::min(released_, min); }

std::vector<ReadGate::Callback> ReadGate::TakeAll() {
  std::vector<Callback> out;
  out.reserve(waiters_.size());
  for (auto& [id, w] : waiters_) out.push_back(std::move(w.ready));
  waiters_.clear();
  by_need_.clear();
  return out;
}

int64_t ReadGate::MaxParkedNeed() const {
  int64_t m = std::numeric_limits<int64_t>::min();
  for (const auto& [id, w] : waiters_) m = std::max(m, w.need);
  return m;
}

void ReadGate::RecordServed(int64_t reader_clock, int64_t reflected) {
  const int64_t stale = std::max<int64_t>(0, reader_clock - reflected);
  sum_ += static_cast<double>(stale);
  ++count_;
  max_ = std::max(max_, stale);
}

}  // namespace pscluster
