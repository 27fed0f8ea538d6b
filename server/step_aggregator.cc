#include "server/step_aggregator.h"

namespace pscluster {

std::shared_ptr<StepAggregator::Step> StepAggregator::StepFor(int64_t step) {
  absl::MutexLock l(&mu_);
  auto& slot = steps_[step];
  if (!slot) slot = std::make_shared<Step>();
  return slot;
}

std::vector<float> StepAggregator::TakeSpare(uint64_t elems) {
  absl::MutexLock l(&spare_mu_);
  size_t best = spare_.size();
  for (size_t i = 0; i < spare_.size(); ++i) {
    const size_t cap = spare_[i].capacity();
    if (cap >= elems && (best == spare_.size() || cap < spare_[best].capacity())) best = i;
  }
  if (best == spare_.size()) return {};
  std::vector<float> out = std::move(spare_[best]);
  spare_.erase(spare_.begin() + best);
  return out;
}

void StepAggregator::AddDense(int64_t step_no, uint32_t table, uint64_t block, uint64_t elems,
                              absl::FunctionRef<void(float* sum)> add) {
  std::shared_ptr<Step> step = StepFor(step_no);
  absl::MutexLock a(&step->mu);
  auto& sum = step->dense[{table, block}];
  if (sum.empty()) {
    sum = TakeSpare(elems);  // A previous step's sum of this block, normally.
    sum.assign(elems, 0.f);
  }
  add(sum.data());
}

void StepAggregator::AddSparse(int64_t step_no, uint32_t table, uint32_t width,
                               absl::Span<const uint64_t> keys, const float* g) {
  std::shared_ptr<Step> step = StepFor(step_no);
  absl::MutexLock a(&step->mu);
  auto& rows = step->sparse[table];
  for (size_t r = 0; r < keys.size(); ++r) {
    auto& row = rows[keys[r]];
    if (row.empty()) row.assign(width, 0.f);
    for (uint32_t j = 0; j < width; ++j) row[j] += g[r * width + j];
  }
}

std::vector<std::pair<int64_t, std::shared_ptr<StepAggregator::Step>>> StepAggregator::TakeBefore(
    int64_t min) {
  std::vector<std::pair<int64_t, std::shared_ptr<Step>>> out;
  absl::MutexLock l(&mu_);
  while (!steps_.empty() && steps_.begin()->first < min) {
    out.emplace_back(steps_.begin()->first, std::move(steps_.begin()->second));
    steps_.erase(steps_.begin());
  }
  return out;
}

void StepAggregator::Recycle(Step* step) {
  std::vector<std::vector<float>> freed;
  {
    absl::MutexLock a(&step->mu);
    for (auto& [key, sum] : step->dense) freed.push_back(std::move(sum));
    step->dense.clear();
  }
  if (freed.empty()) return;
  absl::MutexLock l(&spare_mu_);
  const size_t keep = 2 * freed.size();
  for (auto& f : freed) spare_.push_back(std::move(f));
  if (spare_.size() > keep) spare_.erase(spare_.begin(), spare_.end() - keep);  // Oldest go.
}

void StepAggregator::Clear() {
  absl::MutexLock l(&mu_);
  steps_.clear();
}

size_t StepAggregator::pending_steps() const {
  absl::MutexLock l(&mu_);
  return steps_.size();
}

size_t StepAggregator::spares() const {
  absl::MutexLock l(&spare_mu_);
  return spare_.size();
}

}  // namespace pscluster
