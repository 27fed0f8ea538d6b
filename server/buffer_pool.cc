#include "server/buffer_pool.h"

#include <cstdlib>

namespace pscluster {
namespace {

constexpr int kMinClass = 12;  // 4 KiB.
constexpr int kClasses = 20;   // Up to 2 GiB.

struct SliceOwner {
  std::shared_ptr<BufferPool> pool;
  BufferPool::Buffer buffer;
};

void ReleaseSlice(void* p) {
  auto* owner = static_cast<SliceOwner*>(p);
  owner->pool->Release(owner->buffer);
  delete owner;
}

}  // namespace

std::shared_ptr<BufferPool> BufferPool::Create(size_t max_cached_bytes) {
  std::shared_ptr<BufferPool> p(new BufferPool(max_cached_bytes));
  absl::MutexLock l(&p->mu_);
  p->free_.resize(kClasses);
  return p;
}

BufferPool::~BufferPool() {
  absl::MutexLock l(&mu_);
  for (auto& list : free_) {
    for (char* b : list) std::free(b);
  }
}

int BufferPool::SizeClass(size_t size) {
  int c = 0;
  while ((size_t{1} << (c + kMinClass)) < size) ++c;
  return c;
}

BufferPool::Buffer BufferPool::Acquire(size_t size) {
  int c = SizeClass(size == 0 ? 1 : size);
  size_t cap = size_t{1} << (c + kMinClass);
  if (c < kClasses) {
    absl::MutexLock l(&mu_);
    if (!free_[c].empty()) {
      char* d = free_[c].back();
      free_[c].pop_back();
      cached_ -= cap;
      return {d, cap};
    }
  }
  return {static_cast<char*>(std::aligned_alloc(64, cap)), cap};
}

void BufferPool::Release(Buffer b) {
  if (b.data == nullptr) return;
  int c = SizeClass(b.capacity);
  {
    absl::MutexLock l(&mu_);
    if (c < kClasses && cached_ + b.capacity <= max_cached_) {
      free_[c].push_back(b.data);
      cached_ += b.capacity;
      return;
    }
  }
  std::free(b.data);
}

grpc::Slice BufferPool::ToSlice(Buffer b, size_t len, size_t offset) {
  auto* owner = new SliceOwner{shared_from_this(), b};
  return grpc::Slice(b.data + offset, len, &ReleaseSlice, owner);
}

size_t BufferPool::cached_bytes() const {
  absl::MutexLock l(&mu_);
  return cached_;
}

}  // namespace pscluster
