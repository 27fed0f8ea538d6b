// Validation of control-plane requests (CreateTables, UpdateShardMap). Errors are
// INVALID_ARGUMENT and name the field, e.g. "tables[1].optimizer.learning_rate = nan: ...".
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

// Checks a shard map's structure (one assignment per shard, in order).
absl::Status ValidateShardMap(const v1::ShardMap& map, absl::string_view field);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_VALIDATE_H_
