#include "worker/data/shuffle_window.h"

#include <utility>

#include "common/sharding.h"

namespace pscluster::data {

ShuffleWindow::ShuffleWindow(size_t capacity, uint64_t seed)
    : capacity_(capacity), state_(Mix64(seed ^ 0x77696e646f77ULL)) {}

size_t ShuffleWindow::Random(size_t n) {
  state_ += 0x9e3779b97f4a7c15ULL;
  const uint64_t r = Mix64(state_);
  return static_cast<size_t>((static_cast<unsigned __int128>(r) * n) >> 64);
}

bool ShuffleWindow::Push(Example* e) {
  if (capacity_ <= 1) return true;
  if (size_ < capacity_) {
    if (slots_.size() == size_) slots_.emplace_back();
    std::swap(slots_[size_++], *e);
    e->Clear();
    return false;
  }
  std::swap(slots_[Random(capacity_)], *e);
  return true;
}

bool ShuffleWindow::Drain(Example* e) {
  if (size_ == 0) return false;
  const size_t j = Random(size_);
  std::swap(slots_[j], *e);
  if (j != size_ - 1) std::swap(slots_[j], slots_[size_ - 1]);
  --size_;
  return true;
}

}  // namespace pscluster::data
