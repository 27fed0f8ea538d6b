// Gathers a batch of examples (by id) from an in-memory data set into contiguous buffers and
// returns the kernels::Batch view a model consumes. Reuses its buffers across calls.
#ifndef PSCLUSTER_WORKER_BATCHER_H_
#define PSCLUSTER_WORKER_BATCHER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kernels/models/model.h"
#include "worker/data/dataset.h"

namespace pscluster::worker {

class Batcher {
 public:
  // REQUIRES: the data set outlives the batcher.
  explicit Batcher(const data::DenseDataset* dense) : dense_(dense) {}
  explicit Batcher(const data::SparseDataset* sparse) : sparse_(sparse) {}

  // The examples `ids` as a batch. The view stays valid until the next call.
  // REQUIRES: every id is in [0, n).
  kernels::Batch Make(absl::Span<const int64_t> ids);

  int64_t size() const { return dense_ != nullptr ? dense_->n : sparse_->n; }

 private:
  const data::DenseDataset* dense_ = nullptr;
  const data::SparseDataset* sparse_ = nullptr;
  std::vector<float> x_;
  std::vector<uint64_t> offsets_;
  std::vector<uint64_t> keys_;
  std::vector<float> values_;
  std::vector<int32_t> labels_;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_BATCHER_H_
