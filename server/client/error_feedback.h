// Error feedback for the compressed pushes of one dense table (top-k or int8; CompressionSpec):
// what a step's compressed push does not carry is kept as the table's residual and added to the
// next step's gradient, so that every part of every gradient reaches the servers eventually
// (Seide et al. 2014, "1-bit stochastic gradient descent"; Karimireddy et al. 2019, "Error
// feedback fixes SignSGD"). Invariant, per element: sum of the values sent over steps 0..s plus
// the residual after step s equals the sum of the gradients of steps 0..s.
//
// The residual lives in the worker's memory only: when a rank's task is lost, its residual is
// lost with it (at most one step's worth of unsent gradient per element), and the task that takes
// the rank over starts from a zero residual.
//
// Thread model: not thread-safe; PsClient serializes calls per table.
#ifndef PSCLUSTER_SERVER_CLIENT_ERROR_FEEDBACK_H_
#define PSCLUSTER_SERVER_CLIENT_ERROR_FEEDBACK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace pscluster {

// One dense block's compressed push: PushChunk.values, .indices and .scales.
struct CompressedBlock {
  v1::DataType dtype = v1::DT_FLOAT32;  // Of `values`.
  std::string values;
  std::string indices;  // Top-k: packed little-endian uint32 offsets within the block.
  std::string scales;   // int8: packed float32, one per kInt8ScaleGroup values.
};

class ErrorFeedback {
 public:
  // A table of `elems` elements in blocks of `block_elems`. REQUIRES: spec has topk_ratio in
  // (0, 1) or quantize INT8 (not both); transport is the top-k values' type (float32, float16 or
  // bfloat16).
  ErrorFeedback(uint64_t elems, uint64_t block_elems, const v1::CompressionSpec& spec,
                v1::DataType transport);

  // Compresses grad[0, elems) of `step` plus the residual carried into that step, one
  // CompressedBlock per block, and keeps what was not sent as the residual for the next step.
  // Called again for the same step (a push retried after it failed), it starts again from the
  // residual carried into that step, so the retry sends the same chunks and the residual is not
  // counted twice. FAILED_PRECONDITION for a step older than the last one compressed.
  absl::StatusOr<std::vector<CompressedBlock>> Compress(int64_t step, const float* grad);

  // The residual after the last Compress (zero before the first).
  const std::vector<float>& residual() const { return after_; }
  int64_t last_step() const { return step_; }

 private:
  // Compresses c[0, n) into *out and leaves in c what was not sent.
  void CompressBlock(float* c, uint64_t n, CompressedBlock* out);

  const uint64_t elems_, block_elems_;
  const v1::CompressionSpec spec_;
  const v1::DataType transport_;
  int64_t step_ = -1;
  std::vector<float> before_;  // Residual carried into step_.
  std::vector<float> after_;   // Residual after step_.
  // Scratch of one block: its values as the servers decode them, its int8 scales.
  std::vector<float> sent_, scales_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_ERROR_FEEDBACK_H_
