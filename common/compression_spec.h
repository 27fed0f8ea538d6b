// Checks of a table's compression (CompressionSpec's topk_ratio, quantize, pull_topk_ratio),
// shared by the scheduler (job files), the servers (CreateTables) and the data-plane client, so
// that all three refuse the same settings with the same words.
#ifndef PSCLUSTER_COMMON_COMPRESSION_SPEC_H_
#define PSCLUSTER_COMMON_COMPRESSION_SPEC_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"

namespace pscluster {

// INVALID_ARGUMENT naming `field`.topk_ratio / .pull_topk_ratio / .quantize / .transport when:
// topk_ratio or pull_topk_ratio is not in [0, 1); quantize is not a known value; topk_ratio and
// quantize are both set (not supported together); quantize int8 with a transport other than
// float32 (a push-pull's reply of an int8 push is float32).
absl::Status CheckCompressionSpec(const v1::CompressionSpec& cs, absl::string_view field);

// Largest block a table with pull compression may have (a block's reply is one message).
inline constexpr uint64_t kMaxPullViewBlockElems = uint64_t{1} << 20;

// The same for a table (`field` names the table), and: top-k or int8 on a sparse table (not
// supported: sparse pushes send only the rows touched, uncompressed); pull_topk_ratio on a
// sparse table, or with blocks over kMaxPullViewBlockElems.
absl::Status CheckGradientCompression(const v1::TableSpec& t, absl::string_view field);

// True when pulls of the table send only what changed most (CompressionSpec.pull_topk_ratio).
inline bool CompressesPulls(const v1::CompressionSpec& cs) { return cs.pull_topk_ratio() != 0; }

// PushChunk.pull_view asking for the whole block and a view kept from then on.
inline constexpr uint64_t kPullViewStart = ~uint64_t{0};

// True when pushes of the table are compressed with error feedback (top-k or int8).
inline bool CompressesGradients(const v1::CompressionSpec& cs) {
  return cs.topk_ratio() != 0 || cs.quantize() != v1::CompressionSpec::QUANTIZE_NONE;
}

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_COMPRESSION_SPEC_H_
