#include "server/client/error_feedback.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/grad_compress.h"

namespace pscluster {

ErrorFeedback::ErrorFeedback(uint64_t elems, uint64_t block_elems,
                             const v1::CompressionSpec& spec, v1::DataType transport)
    : elems_(elems),
      block_elems_(block_elems),
      spec_(spec),
      transport_(transport),
      before_(elems, 0.f),
      after_(elems, 0.f) {}

absl::StatusOr<std::vector<CompressedBlock>> ErrorFeedback::Compress(int64_t step,
                                                                     const float* grad) {
  if (step < step_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step, " is older than step ", step_, ", whose push is already compressed"));
  }
  if (step > step_) {
    before_.swap(after_);  // The last step's leftovers are carried into this one.
    step_ = step;
  }
  std::vector<CompressedBlock> out;
  out.reserve((elems_ + block_elems_ - 1) / block_elems_);
  for (uint64_t first = 0; first < elems_; first += block_elems_) {
    const uint64_t n = std::min(block_elems_, elems_ - first);
    // This step's values to send, c = gradient + carried residual, are made in place of the new
    // residual; CompressBlock subtracts what it sends.
    float* c = after_.data() + first;
    const float* g = grad + first;
    const float* r = before_.data() + first;
    for (uint64_t i = 0; i < n; ++i) c[i] = g[i] + r[i];
    out.emplace_back();
    CompressBlock(c, n, &out.back());
  }
  return out;
}

void ErrorFeedback::CompressBlock(float* c, uint64_t n, CompressedBlock* out) {
  if (spec_.quantize() == v1::CompressionSpec::QUANTIZE_INT8) {
    out->dtype = v1::DT_INT8;
    out->values.resize(n);
    scales_.resize(NumScaleGroups(n, kInt8ScaleGroup));
    auto* q = reinterpret_cast<int8_t*>(out->values.data());
    QuantizeInt8(c, n, kInt8ScaleGroup, q, scales_.data());
    // What the servers will decode.
    sent_.resize(n);
    DequantizeInt8(q, n, kInt8ScaleGroup, scales_.data(), sent_.data());
    for (uint64_t i = 0; i < n; ++i) c[i] -= sent_[i];
    out->scales.assign(reinterpret_cast<const char*>(scales_.data()), scales_.size() * 4);
    return;
  }
  out->dtype = transport_;
  const std::vector<uint32_t> idx = SelectTopK(c, n, TopKCount(n, spec_.topk_ratio()));
  sent_.resize(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) sent_[i] = c[idx[i]];
  out->values.resize(idx.size() * DTypeSize(transport_));
  EncodeFloats(sent_.data(), idx.size(), transport_, out->values.data());
  // The residual keeps the rounding of fp16/bf16 too: what is sent is what is decoded.
  DecodeFloats(out->values.data(), idx.size(), transport_, sent_.data());
  // The rest of c is not sent and stays as it is.
  for (size_t i = 0; i < idx.size(); ++i) c[idx[i]] -= sent_[i];
  out->indices.assign(reinterpret_cast<const char*>(idx.data()), idx.size() * 4);
}

}  // namespace pscluster
