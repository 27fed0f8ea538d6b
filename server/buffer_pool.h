// Reusable, 64-byte aligned byte buffers handed to gRPC as slices without a copy. A buffer
// returns to the pool when gRPC releases its slice, so steady-state traffic touches warm pages
// instead of faulting in fresh ones for every message.
#ifndef PSCLUSTER_SERVER_BUFFER_POOL_H_
#define PSCLUSTER_SERVER_BUFFER_POOL_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/slice.h"

namespace pscluster {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // Keeps at most `max_cached_bytes` of idle buffers.
  static std::shared_ptr<BufferPool> Create(size_t max_cached_bytes = 256 << 20);

  // A buffer of at least `size` bytes; give it back with ToSlice() or Release().
  struct Buffer {
    char* data = nullptr;
    size_t capacity = 0;
  };
  Buffer Acquire(size_t size);
  void Release(Buffer b);
  // Wraps `len` bytes of `b` from `offset` in a slice; the buffer returns here when gRPC (and
  // every copy of the slice) lets go of it.
  grpc::Slice ToSlice(Buffer b, size_t len, size_t offset = 0);

  size_t cached_bytes() const;
  ~BufferPool();

 private:
  BufferPool(size_t max_cached) : max_cached_(max_cached) {}
  static int SizeClass(size_t size);

  const size_t max_cached_;
  mutable absl::Mutex mu_;
  std::vector<std::vector<char*>> free_ ABSL_GUARDED_BY(mu_);  // Per power-of-two class.
  size_t cached_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_BUFFER_POOL_H_
