#include "worker/in_memory_data.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace pscluster::worker {

absl::StatusOr<std::unique_ptr<InMemoryTrainSource>> InMemoryTrainSource::Create(
    const TaskData* data, uint64_t seed, const data::PartitionSpec& part, uint32_t job_batch,
    int64_t steps_per_epoch) {
  auto partition = data::PartitionExamples(data->train_size(), seed, part);
  if (!partition.ok()) return partition.status();
  std::unique_ptr<InMemoryTrainSource> s(
      new InMemoryTrainSource(data, seed, part, job_batch, steps_per_epoch));
  s->partition_ = std::move(*partition);
  s->batch_ = RankBatch(part, job_batch, static_cast<int64_t>(s->partition_.size()));
  return s;
}

absl::StatusOr<kernels::Batch> InMemoryTrainSource::BatchFor(int64_t n) {
  const int64_t epoch = n / steps_per_epoch_, j = n % steps_per_epoch_;
  std::vector<int64_t>& order = orders_[epoch & 1];
  if (order_epoch_[epoch & 1] != epoch) {
    order = data::EpochOrder(partition_, seed_, static_cast<uint32_t>(epoch), part_.index);
    order_epoch_[epoch & 1] = epoch;
  }
  ids_.resize(static_cast<size_t>(batch_));
  for (int64_t i = 0; i < batch_; ++i) {
    ids_[i] = order[static_cast<size_t>((j * batch_ + i) % static_cast<int64_t>(order.size()))];
  }
  return batchers_[n & 1]->Make(ids_);
}

absl::StatusOr<std::string> InMemoryTrainSource::Repartition(const data::PartitionSpec& next) {
  // This epoch's order is drawn again from the whole new partition (the positions already
  // trained stay counted).
  auto more = data::PartitionExamples(data_->train_size(), seed_, next);
  if (!more.ok()) return more.status();
  batch_ = RankBatch(next, job_batch_, static_cast<int64_t>(more->size()));
  partition_ = std::move(*more);
  order_epoch_[0] = order_epoch_[1] = -1;
  return absl::StrCat("now reads ", partition_.size(), " examples (part ", part_.index, " and ",
                      next.also.size(), " more of ", part_.count,
                      next.shares.empty() ? "" : ", sized by speed", "), ", batch_, " per step");
}

absl::Status InMemoryTestSource::Start() {
  next_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<kernels::Batch> InMemoryTestSource::Next(int64_t max_examples) {
  const int64_t n = std::min(max_examples, data_->test_size() - next_);
  ids_.resize(static_cast<size_t>(std::max<int64_t>(0, n)));
  std::iota(ids_.begin(), ids_.end(), next_);
  next_ += static_cast<int64_t>(ids_.size());
  if (ids_.empty()) return kernels::Batch();
  return batcher_->Make(ids_);
}

}  // namespace pscluster::worker
