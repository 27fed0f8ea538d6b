// Optimizer step counts of one dense block, element by element.
//
// Rules with a per-step count (Adam's bias correction uses t) need the number of steps each
// element has seen. A push may cover any part of a block, in chunks of any split arriving in any
// order, so elements of one block can have seen different numbers of steps. The counts are kept
// as runs of equal counts (one run in the usual case: every push covers the whole block); a
// block cut into more than kMaxRuns runs switches to one count per element, so a client that
// pushes scattered slices costs at most 8 bytes per element and never an unbounded list.
//
// Thread model: none; the owning block's mutex guards it.
#ifndef PSCLUSTER_SERVER_STEP_COUNTS_H_
#define PSCLUSTER_SERVER_STEP_COUNTS_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace pscluster {

class StepCounts {
 public:
  static constexpr size_t kMaxRuns = 256;

  // A run of elements [previous run's end, end) that have all seen `steps` steps.
  struct Run {
    uint64_t end = 0;
    int64_t steps = 0;
    bool operator==(const Run& o) const { return end == o.end && steps == o.steps; }
  };

  // `elems` elements, none stepped yet.
  explicit StepCounts(uint64_t elems);

  // Counts one more step for elements [offset, offset + n) and calls f(first, count, steps) for
  // each stretch of them that now share a step count, in ascending order.
  // REQUIRES: offset + n <= elems().
  void Advance(uint64_t offset, uint64_t n,
               absl::FunctionRef<void(uint64_t first, uint64_t count, int64_t steps)> f);

  uint64_t elems() const { return elems_; }
  // The most steps any element has seen.
  int64_t max() const;
  // True when every element has seen the same number of steps.
  bool uniform() const;
  // The counts as runs of equal counts, ascending and merged.
  std::vector<Run> Runs() const;

  // Every element at `steps`.
  void SetUniform(int64_t steps);
  // Replaces the counts by `runs` (as Runs() gives them). INVALID_ARGUMENT, naming what is
  // wrong, when the runs are not ascending, do not end at elems() or hold a negative count;
  // nothing changes then.
  absl::Status SetRuns(const std::vector<Run>& runs);

 private:
  void MaybeMerge();

  uint64_t elems_;
  std::vector<Run> runs_;           // Used while per_elem_ is empty.
  std::vector<int64_t> per_elem_;   // One count per element once the runs grew past kMaxRuns.
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_STEP_COUNTS_H_
