// Initial parameter values computed on the host from a ParamInfo's InitializerSpec, for
// single-process training (tests, benchmarks, an in-process baseline). The values depend only on
// (init.seed, name, element index or row key), like a server's, and follow the same
// distribution; they are not bit-identical to any server's own initialisation.
#ifndef PSCLUSTER_KERNELS_MODELS_HOST_INIT_H_
#define PSCLUSTER_KERNELS_MODELS_HOST_INIT_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/models/model.h"

namespace pscluster::kernels {

// Fills a dense parameter (out.size() == num_elements()).
absl::Status InitializeDense(const ParamInfo& param, absl::Span<float> out);
// Fills the rows of a sparse parameter for `keys` (out.size() == keys.size() * row_width).
absl::Status InitializeRows(const ParamInfo& param, absl::Span<const uint64_t> keys,
                            absl::Span<float> out);

// Host storage for every parameter of a model, for single-process training: dense tables in
// full, sparse tables as a map from key to row (rows created on first use).
class HostParams {
 public:
  explicit HostParams(const Model& model);
  // Values (and keys) for a step whose sparse keys are `keys` (from Model::SparseKeys); creates
  // missing rows. The views stay valid until the next call.
  absl::StatusOr<ParamValues> Gather(const std::vector<std::vector<uint64_t>>& keys);
  // Matching gradient buffers for the last Gather().
  Gradients GradientBuffers();
  // Plain SGD: every value -= learning_rate * gradient, for the last Gather()'s layout.
  void ApplySgd(const Gradients& grads, float learning_rate);
  std::vector<float>& dense(size_t i) { return dense_[i]; }

 private:
  const std::vector<ParamInfo> params_;
  std::vector<std::vector<float>> dense_;
  std::vector<absl::flat_hash_map<uint64_t, size_t>> row_index_;  // Sparse: key -> row.
  std::vector<std::vector<float>> row_values_;                      // Sparse: the rows.
  std::vector<std::vector<uint64_t>> step_keys_;    // Last Gather()'s keys.
  std::vector<std::vector<float>> step_rows_;       // Last Gather()'s rows (copies).
  std::vector<std::vector<float>> grad_storage_;
};

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_MODELS_HOST_INIT_H_
