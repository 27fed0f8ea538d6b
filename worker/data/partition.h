// Which examples a worker reads, and in what order.
//
// The training set is permuted once with the job's seed (the same permutation on every worker);
// worker `index` of `count` takes the index-th contiguous part of it, or an explicit range
// [begin, end) when the scheduler gives faster workers larger parts. Each epoch the worker
// shuffles its own part with a seed derived from (job seed, epoch, part), so runs repeat exactly.
#ifndef PSCLUSTER_WORKER_DATA_PARTITION_H_
#define PSCLUSTER_WORKER_DATA_PARTITION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace pscluster::data {

struct PartitionSpec {
  uint32_t index = 0;
  uint32_t count = 1;
  uint64_t begin = 0;  // Explicit range when end > 0.
  uint64_t end = 0;
  // More parts of `count` read too (those of ranks that left the job); not with a range.
  std::vector<uint32_t> also;
};

// INVALID_ARGUMENT naming the field when the spec's extra parts (`also`) do not fit it: each
// must be another part below `count`, named once, and not with an explicit range.
absl::Status CheckExtraParts(const PartitionSpec& spec);

// Example ids of the partition, in the job's permutation order (the parts in `also` follow the
// index-th part). INVALID_ARGUMENT names the field
// when the spec does not fit `n` examples.
absl::StatusOr<std::vector<int64_t>> PartitionExamples(int64_t n, uint64_t seed,
                                                       const PartitionSpec& spec);

// The partition's order for one epoch.
std::vector<int64_t> EpochOrder(const std::vector<int64_t>& part, uint64_t seed, uint32_t epoch,
                                uint32_t part_index);

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_PARTITION_H_
