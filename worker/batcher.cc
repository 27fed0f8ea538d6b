#include "worker/batcher.h"

#include <cstring>

namespace pscluster::worker {

kernels::Batch Batcher::Make(absl::Span<const int64_t> ids) {
  kernels::Batch b;
  b.num_examples = static_cast<int64_t>(ids.size());
  labels_.resize(ids.size());
  if (dense_ != nullptr) {
    const size_t dim = static_cast<size_t>(dense_->dim);
    x_.resize(ids.size() * dim);
    for (size_t i = 0; i < ids.size(); ++i) {
      std::memcpy(&x_[i * dim], &dense_->x[static_cast<size_t>(ids[i]) * dim], dim * sizeof(float));
      labels_[i] = dense_->y[ids[i]];
    }
    b.dense = x_;
  } else {
    offsets_.assign(1, 0);
    keys_.clear();
    values_.clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      uint64_t begin = sparse_->offsets[ids[i]], end = sparse_->offsets[ids[i] + 1];
      keys_.insert(keys_.end(), sparse_->keys.begin() + begin, sparse_->keys.begin() + end);
      values_.insert(values_.end(), sparse_->values.begin() + begin, sparse_->values.begin() + end);
      offsets_.push_back(keys_.size());
      labels_[i] = sparse_->y[ids[i]];
    }
    b.offsets = offsets_;
    b.keys = keys_;
    b.values = values_;
  }
  b.labels = labels_;
  return b;
}

}  // namespace pscluster::worker
