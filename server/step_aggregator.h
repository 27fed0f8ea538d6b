// Synchronous aggregation (ConsistencySpec.aggregate): the gradients every rank pushed for a step
// summed per dense block and per sparse row, held until the step is complete on every rank and
// then applied once, as one update.
//
// Thread model: thread-safe. `mu_` guards the map of steps; each step's sums have a lock of
// their own, so ranks pushing different blocks of one step add concurrently only for the step's
// lookup. No I/O; the owner applies a finished step's sums to its tables.
#ifndef PSCLUSTER_SERVER_STEP_AGGREGATOR_H_
#define PSCLUSTER_SERVER_STEP_AGGREGATOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace pscluster {

class StepAggregator {
 public:
  // One step's sums.
  struct Step {
    absl::Mutex mu;
    // (table, block) -> summed gradient of the whole block.
    std::map<std::pair<uint32_t, uint64_t>, std::vector<float>> dense ABSL_GUARDED_BY(mu);
    // table -> key -> summed gradient row.
    std::map<uint32_t, absl::flat_hash_map<uint64_t, std::vector<float>>> sparse
        ABSL_GUARDED_BY(mu);
  };

  // Adds to `step`'s sum of dense block (table, block) of `elems` elements: `add` gets the sum
  // (zeros the first time) with the step's lock held.
  void AddDense(int64_t step, uint32_t table, uint64_t block, uint64_t elems,
                absl::FunctionRef<void(float* sum)> add);
  // Adds rows of `width` floats (`g`, one row per key, in order) to `step`'s sums of `table`.
  // A key listed twice adds twice.
  void AddSparse(int64_t step, uint32_t table, uint32_t width, absl::Span<const uint64_t> keys,
                 const float* g);

  // Removes the steps below `min` (complete on every rank) and returns them, oldest first.
  std::vector<std::pair<int64_t, std::shared_ptr<Step>>> TakeBefore(int64_t min);
  // Keeps a taken step's dense sums for the next steps' blocks (at most two steps' worth): a
  // fresh buffer per block and step costs a kernel page fault per 4 KiB touched and an munmap
  // when freed, which took most of an aggregated step's time. REQUIRES: `step` was taken and
  // is applied.
  void Recycle(Step* step);
  // Forgets every step's sums (a restore, a rewind, a drop).
  void Clear();
  size_t pending_steps() const;
  size_t spares() const;

 private:
  std::shared_ptr<Step> StepFor(int64_t step);
  // A spare buffer of at least `elems` floats (the smallest that fits), or an empty one.
  std::vector<float> TakeSpare(uint64_t elems);

  mutable absl::Mutex mu_;
  std::map<int64_t, std::shared_ptr<Step>> steps_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex spare_mu_;
  std::vector<std::vector<float>> spare_ ABSL_GUARDED_BY(spare_mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_STEP_AGGREGATOR_H_
