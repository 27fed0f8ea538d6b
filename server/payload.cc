#include "server/payload.h"

#include <algorithm>
#include <cstring>

#include "common/dtype.h"

namespace pscluster {

Payload::Payload(std::vector<absl::string_view> pieces, std::shared_ptr<const void> owner)
    : owner_(std::move(owner)) {
  for (auto p : pieces) {
    if (!p.empty()) pieces_.push_back(p);
  }
  starts_.reserve(pieces_.size());
  for (auto p : pieces_) {
    starts_.push_back(size_);
    size_ += p.size();
  }
}

Payload Payload::FromString(std::string bytes) {
  auto owned = std::make_shared<std::string>(std::move(bytes));
  std::vector<absl::string_view> pieces;
  if (!owned->empty()) pieces.emplace_back(*owned);
  return Payload(std::move(pieces), owned);
}

void Payload::CopyTo(size_t pos, size_t n, void* out) const {
  char* dst = static_cast<char*>(out);
  if (n == 0) return;
  // The last piece starting at or before pos.
  size_t i = std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin() - 1;
  pos -= starts_[i];
  for (; i < pieces_.size() && n > 0; ++i) {
    absl::string_view p = pieces_[i];
    size_t take = std::min(n, p.size() - pos);
    std::memcpy(dst, p.data() + pos, take);
    dst += take;
    n -= take;
    pos = 0;
  }
}

void Payload::DecodeFloats(v1::DataType dtype, size_t first, size_t n, float* out) const {
  const size_t es = DTypeSize(dtype);
  if (dtype == v1::DT_FLOAT32 || es == 0) {
    CopyTo(first * 4, n * 4, out);
    return;
  }
  // 2-byte types: stage through a small buffer so elements split across pieces decode right.
  uint16_t tmp[2048];
  while (n > 0) {
    size_t k = std::min<size_t>(n, 2048);
    CopyTo(first * es, k * es, tmp);
    ::pscluster::DecodeFloats(tmp, k, dtype, out);
    first += k;
    out += k;
    n -= k;
  }
}

void Payload::ForEachFloatRun(v1::DataType dtype, size_t first, size_t n, float* scratch,
                              size_t scratch_floats,
                              absl::FunctionRef<void(size_t, const float*, size_t)> f) const {
  size_t done = 0;
  while (done < n) {
    if (dtype == v1::DT_FLOAT32) {
      const size_t pos = (first + done) * 4;
      size_t i = std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin() - 1;
      const char* p = pieces_[i].data() + (pos - starts_[i]);
      const size_t whole = (pieces_[i].size() - (pos - starts_[i])) / 4;
      if (whole > 0 && (reinterpret_cast<uintptr_t>(p) & 3) == 0) {
        const size_t k = std::min(whole, n - done);
        f(done, reinterpret_cast<const float*>(p), k);
        done += k;
        continue;
      }
    }
    const size_t k = std::min(scratch_floats, n - done);
    DecodeFloats(dtype, first + done, k, scratch);
    f(done, scratch, k);
    done += k;
  }
}

std::string Payload::ToString() const {
  std::string s(size_, '\0');
  CopyTo(0, size_, s.data());
  return s;
}

}  // namespace pscluster
