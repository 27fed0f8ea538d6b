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
  std::vector<float> c;
  for (uint64_t first = 0; first < elems_; first += block_elems_) {
    const uint64_t n = std::min(block_elems_, elems_ - first);
    c.resize(n);
    for (uint64_t i = 0; i < n; ++i) c[i] = grad[first + i] + before_[first + i];
    out.emplace_back();
    CompressBlock(c.data(), n, after_.data() + first, &out.back());
  }
  return out;
}

void ErrorFeedback::CompressBlock(const float* c, uint64_t n, float* left,
                                  CompressedBlock* out) const {
  std::vector<float> sent(n, 0.f);  // What the servers will decode.
  if (spec_.quantize() == v1::CompressionSpec::QUANTIZE_INT8) {
    out->dtype = v1::DT_INT8;
    out->values.resize(n);
    std::vector<float> scales(NumScaleGroups(n, kInt8ScaleGroup));
    auto* q = reinterpret_cast<int8_t*>(out->values.data());
    QuantizeInt8(c, n, kInt8ScaleGroup, q, scales.data());
    DequantizeInt8(q, n, kInt8ScaleGroup, scales.data(), sent.data());
    out->scales.assign(reinterpret_cast<const char*>(scales.data()), scales.size() * 4);
  } else {
    out->dtype = transport_;
    const std::vector<uint32_t> idx = SelectTopK(c, n, TopKCount(n, spec_.topk_ratio()));
    std::vector<float> vals(idx.size());
    for (size_t i = 0; i < idx.size(); ++i) vals[i] = c[idx[i]];
    out->values.resize(vals.size() * DTypeSize(transport_));
    EncodeFloats(vals.data(), vals.size(), transport_, out->values.data());
    // The residual keeps the rounding of fp16/bf16 too: what is sent is what is decoded.
    DecodeFloats(out->values.data(), vals.size(), transport_, vals.data());
    for (size_t i = 0; i < idx.size(); ++i) sent[idx[i]] = vals[i];
    out->indices.assign(reinterpret_cast<const char*>(idx.data()), idx.size() * 4);
  }
  for (uint64_t i = 0; i < n; ++i) left[i] = c[i] - sent[i];
}

}  // namespace pscluster
