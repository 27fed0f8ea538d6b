// Limits the parameter servers enforce, in one place: the servers refuse what exceeds them, and
// the scheduler refuses a job that would exceed them at submission, from the same constants,
// instead of queueing it and failing on the servers later.
#ifndef PSCLUSTER_COMMON_LIMITS_H_
#define PSCLUSTER_COMMON_LIMITS_H_

#include <cstdint>

namespace pscluster {

// Workers (ranks) of one job: each has a clock and an exactly-once record on every server.
inline constexpr uint32_t kMaxWorkers = 1 << 16;
// Virtual shards of one job: each server keeps per-shard state from the start.
inline constexpr uint32_t kMaxVirtualShards = 1 << 16;
// Elements of a dense block: 4 MiB of float32, one chunk.
inline constexpr uint64_t kMaxBlockElems = 1 << 20;
// Blocks of a dense table: the table keeps a pointer per block from its creation on.
inline constexpr uint64_t kMaxBlocks = 1 << 22;
// Elements of a dense table.
inline constexpr uint64_t kMaxTableElems = uint64_t{1} << 42;
// Elements of a sparse table's row.
inline constexpr uint32_t kMaxRowWidth = 1 << 16;
// Steps of a learning-rate schedule's decay or warm-up.
inline constexpr uint64_t kMaxScheduleSteps = uint64_t{1} << 50;
// The most sparse rows a worker pulls to export a model of the user's data (every key of its
// key space); checked at submission.
inline constexpr uint64_t kMaxExportKeys = uint64_t{1} << 22;

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_LIMITS_H_
