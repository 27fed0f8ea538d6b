// Which examples a worker reads, and in what order.
//
// The training set is permuted once with the job's seed (the same permutation on every worker);
// worker `index` of `count` takes the index-th contiguous part of it (the parts equal, or sized
// by `shares` when the scheduler gives faster workers larger parts), or an explicit range
// [begin, end). Each epoch the worker shuffles its own part with a seed derived from (job seed,
// epoch, part), so runs repeat exactly.
#ifndef PSCLUSTER_WORKER_DATA_PARTITION_H_
#define PSCLUSTER_WORKER_DATA_PARTITION_H_

#include <cstdint>
#include <utility>
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
  // Relative sizes of the `count` parts (empty = equal): part a covers examples
  // [n * S(a) / S, n * S(a + 1) / S) of the permutation, S(a) the sum of the shares before a.
  std::vector<uint32_t> shares;
};

// The most a share may be (so that n * S fits 128-bit arithmetic with room to spare).
inline constexpr uint32_t kMaxShare = 1u << 24;

// INVALID_ARGUMENT naming the field when the spec's extra parts (`also`) or its shares do not
// fit it: each extra part must be another part below `count`, named once, and not with an
// explicit range; shares, when given, are `count` values in [1, kMaxShare], not with a range.
absl::Status CheckPartition(const PartitionSpec& spec);

// Units [begin, end) of part `a` of `n` units (examples, files or bytes): the a-th of `count`
// equal parts, or sized by `shares`. Ignores `begin`/`end`/`also`.
// REQUIRES: spec passed CheckPartition, spec.count > 0, a < spec.count.
std::pair<uint64_t, uint64_t> PartBounds(uint64_t n, const PartitionSpec& spec, uint32_t a);

// Examples per step of the worker reading `spec`, for a job whose `batch` is the equal part's:
// the same share of the job's `batch * count` examples per step as its parts' share of the
// data, so that every rank covers its parts in the job's steps per epoch. `batch` itself for one
// equal part; at least 1. The spec must have passed CheckPartition.
uint32_t RankBatch(const PartitionSpec& spec, uint32_t batch);

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
