// Validation of control-plane requests (CreateTables, UpdateShardMap). Errors are
// INVALID_ARGUMENT and name the field, e.g. "tables[1].optimizer.learning_rate = nan: ...".
#ifndef PSCLUSTER_SERVER_VALIDATE_H_
#define PSCLUSTER_SERVER_VALIDATE_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/ps.pb.h"
#include "server/optimizer.h"

namespace pscluster {

inline constexpr uint64_t kMaxBlockElems = 1 << 20;  // 4 MiB of float32: one chunk.
// Blocks per dense table: the table keeps a pointer per block from its creation on.
inline constexpr uint64_t kMaxBlocks = 1 << 22;
inline constexpr uint32_t kMaxRowWidth = 1 << 16;
inline constexpr uint32_t kMaxWorkers = 1 << 16;
inline constexpr uint32_t kMaxVirtualShards = 1 << 16;

// [A-Za-z0-9_.-]{1,128}: job ids also name checkpoint directories.
bool IsValidJobId(absl::string_view id);

// Checks the request; fills `specs` (normalised: dtype float32, block_elems defaulted) and
// their resolved optimizers.
absl::Status ValidateCreateTables(const v1::CreateTablesRequest& req,
                                  std::vector<v1::TableSpec>* specs,
                                  std::vector<OptimizerParams>* optimizers);

// Checks a shard map's structure (one assignment per shard, in order).
absl::Status ValidateShardMap(const v1::ShardMap& map, absl::string_view field);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_VALIDATE_H_
