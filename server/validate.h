// Validation of requests: the control plane's (CreateTables, UpdateShardMap) and what a push
// chunk says of itself. Errors are INVALID_ARGUMENT (RESOURCE_EXHAUSTED for an oversized chunk)
// and name the field, e.g. "tables[1].optimizer.learning_rate = nan: ...". What depends on a
// job's state (its epoch, clocks, fences) is checked by the job.
#ifndef PSCLUSTER_SERVER_VALIDATE_H_
#define PSCLUSTER_SERVER_VALIDATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/limits.h"
#include "proto/ps.pb.h"
#include "server/optimizer.h"

namespace pscluster {

// The limits (kMaxWorkers, kMaxVirtualShards, kMaxBlockElems, ...) are in common/limits.h, which
// the scheduler checks jobs against at submission.

// [A-Za-z0-9_.-]{1,128}: job ids also name checkpoint directories.
bool IsValidJobId(absl::string_view id);

// Checks the request; fills `specs` (normalised: dtype float32, block_elems defaulted) and
// their resolved optimizers.
absl::Status ValidateCreateTables(const v1::CreateTablesRequest& req,
                                  std::vector<v1::TableSpec>* specs,
                                  std::vector<OptimizerParams>* optimizers);

// A step or clock a caller sends: never negative, and at most 2^62, far enough from the int64
// limit that the step + 1 and clock - staleness the consistency rules compute cannot overflow.
absl::Status CheckStep(int64_t v, absl::string_view field);

// float32, float16 or bfloat16: what pushes carry and pulls return.
bool IsFloatTransport(v1::DataType t);

// ---- Push chunks: what a chunk says of itself, checked before and after its slice is resolved
// against the job. Errors name the chunk's field.

// tag.worker within the job's `num_workers` ranks, tag.step a valid step.
absl::Status ValidatePushTag(const v1::PushChunk& chunk, absl::string_view job_id,
                             uint32_t num_workers);
// How the values are encoded: dtype (float32/16, bfloat16, or int8 with per-group scales, on
// dense blocks only), `values_bytes` within `max_chunk_bytes`, pull_clock, and values, indices or
// pull_after only with a table.
absl::Status ValidatePushEncoding(const v1::PushChunk& chunk, uint64_t values_bytes,
                                  uint64_t max_chunk_bytes);
// The values (decoded to `dtype`, `values_bytes` of them) against the slice they update: whole
// elements, within the slice, whole rows of `width`; top-k indices (dense blocks only) one per
// value and inside the block. Sets *n to the number of elements.
struct PushTarget {
  bool dense = true;
  uint64_t block = 0;   // DENSE.
  uint64_t elems = 0;   // Elements of the whole slice.
  uint32_t width = 1;   // SPARSE row width; 1 for dense.
};
absl::Status ValidatePushExtent(const v1::PushChunk& chunk, const PushTarget& target,
                                v1::DataType dtype, uint64_t values_bytes, uint64_t* n);

// Checks a shard map's structure (one assignment per shard, in order).
absl::Status ValidateShardMap(const v1::ShardMap& map, absl::string_view field);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_VALIDATE_H_
