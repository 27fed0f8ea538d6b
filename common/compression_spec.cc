#include "common/compression_spec.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pscluster {

absl::Status CheckCompressionSpec(const v1::CompressionSpec& cs, absl::string_view field) {
  const float r = cs.topk_ratio();
  if (!(r >= 0.f && r < 1.f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".topk_ratio: must be in [0, 1) (0 = dense pushes; 0.01 sends the largest 1% of "
        "each block), got ", r));
  }
  const float p = cs.pull_topk_ratio();
  if (!(p >= 0.f && p < 1.f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".pull_topk_ratio: must be in [0, 1) (0 = whole pulls; 0.01 sends the 1% of each "
        "block that changed most since the worker's last pull), got ", p));
  }
  if (!v1::CompressionSpec::Quantize_IsValid(cs.quantize())) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".quantize: must be none or int8, got ",
                                                   static_cast<int>(cs.quantize())));
  }
  if (r != 0.f && cs.quantize() != v1::CompressionSpec::QUANTIZE_NONE) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".quantize: top-k (topk_ratio) and int8 quantization cannot be combined on one "
        "table; choose one"));
  }
  if (cs.quantize() == v1::CompressionSpec::QUANTIZE_INT8 &&
      cs.transport() != v1::DT_INVALID && cs.transport() != v1::DT_FLOAT32) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".transport: quantize int8 needs float32 transport (the values a push-pull "
        "returns after an int8 push are float32); float16/bfloat16 with int8 is not supported"));
  }
  return absl::OkStatus();
}

absl::Status CheckGradientCompression(const v1::TableSpec& t, absl::string_view field) {
  const std::string f = absl::StrCat(field, ".compression");
  absl::Status st = CheckCompressionSpec(t.compression(), f);
  if (!st.ok()) return st;
  if (t.kind() != v1::DENSE && CompressesGradients(t.compression())) {
    return absl::InvalidArgumentError(absl::StrCat(
        f, t.compression().topk_ratio() != 0 ? ".topk_ratio" : ".quantize",
        ": applies to dense tables only (a sparse push sends only the rows it touched); table '",
        t.name(), "' is sparse"));
  }
  if (t.compression().pull_topk_ratio() != 0) {
    if (t.kind() != v1::DENSE) {
      return absl::InvalidArgumentError(absl::StrCat(
          f, ".pull_topk_ratio: applies to dense tables only (a sparse pull reads the rows it "
          "names); table '", t.name(), "' is sparse"));
    }
    if (t.block_elems() > kMaxPullViewBlockElems) {
      return absl::InvalidArgumentError(absl::StrCat(
          f, ".pull_topk_ratio: needs blocks of at most ", kMaxPullViewBlockElems,
          " elements (each block's reply goes in one message); table '", t.name(), "' has ",
          t.block_elems()));
    }
  }
  return absl::OkStatus();
}

}  // namespace pscluster
