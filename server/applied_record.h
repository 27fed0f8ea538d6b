// The exactly-once record of one job on one server: per rank, the identities of the push chunks
// applied for each of its recent steps. A chunk whose identity is recorded, or whose step is
// below the rank's clock, is a duplicate (acknowledged, not applied again): a worker that
// retries a push after a lost answer, or a new task that resumes a rank, re-sends chunks freely.
//
// Thread model: not thread-safe; its owner (Job) guards it with its clock lock. No I/O.
#ifndef PSCLUSTER_SERVER_APPLIED_RECORD_H_
#define PSCLUSTER_SERVER_APPLIED_RECORD_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/container/flat_hash_set.h"

namespace pscluster {

class AppliedRecord {
 public:
  // step -> identities of the chunks applied for it.
  using Steps = std::map<int64_t, absl::flat_hash_set<uint64_t>>;

  explicit AppliedRecord(uint32_t num_workers) : steps_(num_workers) {}

  // The identity of a push chunk: its tag's sequence number and what it covers (table, dense or
  // sparse, block, the keys' hash, offset, element count).
  static uint64_t ChunkIdentity(uint64_t seq, uint32_t table, bool dense, uint64_t block,
                                uint64_t keys_hash, uint64_t offset, uint64_t n);

  // Records chunk `identity` of `worker`'s `step`, which the rank's `clock` has not passed.
  // Returns false (nothing recorded) when it is a duplicate: recorded before, or of a step
  // below `clock`. REQUIRES: worker < size().
  bool Record(uint32_t worker, int64_t step, int64_t clock, uint64_t identity);
  // Forgets one recorded chunk (its update could not be applied after all).
  void Forget(uint32_t worker, int64_t step, uint64_t identity);
  // `worker`'s clock moved to `clock`: steps below clock - 1 are forgotten. The step just
  // completed stays one step longer: should a backup's copy take over with that step missing
  // there, the worker pushes it again and what was applied here must be a duplicate.
  void Trim(uint32_t worker, int64_t clock);
  // Adds another copy's record of `worker` (a replica taken over), then trims to `clock`.
  void Join(uint32_t worker, const Steps& other, int64_t clock);
  void Clear(uint32_t worker);
  void ClearAll();

  uint32_t size() const { return static_cast<uint32_t>(steps_.size()); }
  const std::vector<Steps>& all() const { return steps_; }

 private:
  std::vector<Steps> steps_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_APPLIED_RECORD_H_
