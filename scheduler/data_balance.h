// Data balancing policy (JobSpec.balance_data): given each rank's measured compute speed, the
// shares of the training set that make every rank's step take about as long, so that the
// faster workers are not held back by a straggler at every BSP/SSP step.
//
// A rank's step computes over its batch, and its batch is its share of the job's examples per
// step (data::RankBatch), so its compute time is share / rate: shares proportional to the ranks'
// compute rates equalise it. Each share is clamped to [1/max_skew, max_skew] equal parts, so a
// rank that measured badly (or is nearly stalled) still reads some data, and no rank reads most
// of it. Nothing changes while every rank's fraction of the data is within `tolerance` of what its
// rate calls for: the rates of a shared machine are noisy, and each change redraws the epoch
// order of every rank.
//
// A pure function of its arguments: thread-safe, no I/O.
#ifndef PSCLUSTER_SCHEDULER_DATA_BALANCE_H_
#define PSCLUSTER_SCHEDULER_DATA_BALANCE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/time/time.h"

namespace pscluster::scheduler {

// An equal part's share (DataPartition.shares are relative; 1000 reads as "one part").
inline constexpr uint32_t kEqualShare = 1000;

struct DataBalanceOptions {
  // A job's shares change at most this often (also: not before the job has run this long).
  absl::Duration every = absl::Seconds(30);
  // The shares change when some rank's fraction of the data would change by more than this
  // fraction of itself.
  double tolerance = 0.15;
  // No rank's share above this many equal parts, nor below one over it.
  double max_skew = 4.0;
};

// New shares (kEqualShare = an equal part) for ranks whose compute rates (examples/s) are
// `rates`, given their `current` shares (empty = equal parts), or nullopt when the current shares
// are within tolerance, or some rate is not a finite number > 0, or there are fewer than 2 ranks.
std::optional<std::vector<uint32_t>> PickDataShares(const std::vector<double>& rates,
                                                    const std::vector<uint32_t>& current,
                                                    const DataBalanceOptions& options = {});

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_DATA_BALANCE_H_
