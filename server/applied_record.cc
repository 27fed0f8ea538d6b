#include "server/applied_record.h"

#include "common/sharding.h"

namespace pscluster {

uint64_t AppliedRecord::ChunkIdentity(uint64_t seq, uint32_t table, bool dense, uint64_t block,
                                      uint64_t keys_hash, uint64_t offset, uint64_t n) {
  uint64_t h = Mix64(seq);
  h = Mix64(h ^ (static_cast<uint64_t>(table) << 1 | (dense ? 1 : 0)));
  h = Mix64(h ^ block);
  h = Mix64(h ^ offset);
  h = Mix64(h ^ keys_hash);
  return Mix64(h ^ n);
}

bool AppliedRecord::Record(uint32_t worker, int64_t step, int64_t clock, uint64_t identity) {
  if (step < clock) return false;
  return steps_[worker][step].insert(identity).second;
}

void AppliedRecord::Forget(uint32_t worker, int64_t step, uint64_t identity) {
  auto it = steps_[worker].find(step);
  if (it == steps_[worker].end()) return;
  it->second.erase(identity);
}

void AppliedRecord::Trim(uint32_t worker, int64_t clock) {
  auto& steps = steps_[worker];
  steps.erase(steps.begin(), steps.lower_bound(clock - 1));
}

void AppliedRecord::Join(uint32_t worker, const Steps& other, int64_t clock) {
  auto& mine = steps_[worker];
  for (const auto& [step, ids] : other) mine[step].insert(ids.begin(), ids.end());
  Trim(worker, clock);
}

void AppliedRecord::Clear(uint32_t worker) { steps_[worker].clear(); }

void AppliedRecord::ClearAll() {
  for (auto& s : steps_) s.clear();
}

}  // namespace pscluster
