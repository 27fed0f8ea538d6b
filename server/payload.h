// The raw value bytes of a data-plane message, kept where they arrived (gRPC receive slices, or a
// string in tests) instead of being copied into a contiguous buffer. Readers take the bytes they
// need piece by piece, decoding fp16/bf16 on the way.
#ifndef PSCLUSTER_SERVER_PAYLOAD_H_
#define PSCLUSTER_SERVER_PAYLOAD_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "proto/common.pb.h"

namespace pscluster {

class Payload {
 public:
  Payload() = default;
  // Pieces in order; `owner` keeps their memory alive for the Payload's life.
  Payload(std::vector<absl::string_view> pieces, std::shared_ptr<const void> owner);
  // A payload owning a copy of `bytes` (tests, small messages).
  static Payload FromString(std::string bytes);

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t num_pieces() const { return pieces_.size(); }

  // Copies bytes [pos, pos + n) to `out`. REQUIRES: pos + n <= size().
  void CopyTo(size_t pos, size_t n, void* out) const;

  // Decodes elements [first, first + n) of `dtype` (FLOAT32, FLOAT16 or BFLOAT16) to float32.
  // REQUIRES: (first + n) * DTypeSize(dtype) <= size().
  void DecodeFloats(v1::DataType dtype, size_t first, size_t n, float* out) const;

  // Visits elements [first, first + n) of `dtype` as float32 runs: f(i, data, k) receives
  // elements [first + i, first + i + k). Where the bytes are float32, 4-byte aligned and within
  // one piece, `data` points into the payload itself; elsewhere the elements are decoded into
  // `scratch` (room for `scratch_floats`, > 0) first.
  void ForEachFloatRun(v1::DataType dtype, size_t first, size_t n, float* scratch,
                       size_t scratch_floats,
                       absl::FunctionRef<void(size_t, const float*, size_t)> f) const;

  // The whole payload as one string (a copy; for tests and small messages).
  std::string ToString() const;
  // The pieces, in order, and what keeps them alive (to send them without a copy).
  const std::vector<absl::string_view>& pieces() const { return pieces_; }
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  std::vector<absl::string_view> pieces_;
  std::vector<size_t> starts_;  // Offset of each piece in the payload.
  std::shared_ptr<const void> owner_;
  size_t size_ = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_PAYLOAD_H_
