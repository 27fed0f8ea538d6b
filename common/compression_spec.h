// Checks of a table's gradient compression (CompressionSpec's topk_ratio and quantize), shared by
// the scheduler (job files), the servers (CreateTables) and the data-plane client, so that all
// three refuse the same settings with the same words.
#ifndef PSCLUSTER_COMMON_COMPRESSION_SPEC_H_
#define PSCLUSTER_COMMON_COMPRESSION_SPEC_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"

namespace pscluster {

// INVALID_ARGUMENT naming `field`.topk_ratio / .quantize / .transport when: topk_ratio is not in
// [0, 1); quantize is not a known value; both are set (not supported together); quantize int8
// with a transport other than float32 (a push-pull's reply of an int8 push is float32).
absl::Status CheckCompressionSpec(const v1::CompressionSpec& cs, absl::string_view field);

// The same for a table (`field` names the table), and: top-k or int8 on a sparse table (not
// supported: sparse pushes send only the rows touched, uncompressed).
absl::Status CheckGradientCompression(const v1::TableSpec& t, absl::string_view field);

// True when pushes of the table are compressed with error feedback (top-k or int8).
inline bool CompressesGradients(const v1::CompressionSpec& cs) {
  return cs.topk_ratio() != 0 || cs.quantize() != v1::CompressionSpec::QUANTIZE_NONE;
}

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_COMPRESSION_SPEC_H_
