// CpuBackend: row gather / scatter-add, embedding bags, half casts and top-k selection.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend_impl.h"
#include "common/half_bits.h"

namespace pscluster::kernels {
namespace {

constexpr int64_t kElementGrain = 1 << 14;
// Scatter-style ops split the row width across threads when rows are at least this wide; every
// thread then owns its columns of every row, so duplicate indices never race.
constexpr int64_t kMinColumnSlice = 32;

absl::Status CheckIndices(const char* op, const int32_t* idx, int64_t n, int64_t table_rows) {
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] < 0 || idx[i] >= table_rows) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": idx[", i, "] = ", idx[i],
                                                     " is outside [0, ", table_rows, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOffsets(const char* op, const int32_t* offsets, int64_t bags, int64_t nnz) {
  if (offsets[0] < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": offsets[0] = ", offsets[0], " < 0"));
  }
  for (int64_t b = 0; b < bags; ++b) {
    if (offsets[b + 1] < offsets[b]) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": offsets decrease at ", b + 1, " (", offsets[b], " > ",
                       offsets[b + 1], ")"));
    }
  }
  if (offsets[bags] > nnz) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": offsets[", bags, "] = ", offsets[bags], " exceeds nnz = ", nnz));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuBackend::DoGatherRows(int64_t n, int64_t width, const float* table,
                                      int64_t table_rows, const int32_t* idx, float* out) {
  if (absl::Status s = CheckIndices("GatherRows", idx, n, table_rows); !s.ok()) return s;
  const int64_t grain = std::max<int64_t>(1, kElementGrain / width);
  pool_.ParallelFor(n, grain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      std::copy_n(table + static_cast<int64_t>(idx[i]) * width, width, out + i * width);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoScatterAddRows(int64_t n, int64_t width, const float* src,
                                          const int32_t* idx, int64_t table_rows, float* table) {
  if (absl::Status s = CheckIndices("ScatterAddRows", idx, n, table_rows); !s.ok()) return s;
  auto add = [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < n; ++i) {
      const float* s = src + i * width;
      float* t = table + static_cast<int64_t>(idx[i]) * width;
      for (int64_t j = c0; j < c1; ++j) t[j] += s[j];
    }
  };
  if (width >= 2 * kMinColumnSlice && n * width >= 2 * kElementGrain) {
    pool_.ParallelFor(width, kMinColumnSlice, add);
  } else {
    add(0, width);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::DoEmbeddingBagForward(int64_t bags, int64_t width, int64_t nnz,
                                               const int32_t* offsets, const int32_t* idx,
                                               const float* weights, const float* table,
                                               int64_t table_rows, float* out) {
  constexpr const char* op = "EmbeddingBagForward";
  if (absl::Status s = CheckOffsets(op, offsets, bags, nnz); !s.ok()) return s;
  if (absl::Status s = CheckIndices(op, idx + offsets[0], offsets[bags] - offsets[0], table_rows);
      !s.ok()) {
    return s;
  }
  const int64_t per_bag = std::max<int64_t>(1, (offsets[bags] - offsets[0]) / bags) * width;
  const int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, per_bag));
  pool_.ParallelFor(bags, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* o = out + b * width;
      std::fill(o, o + width, 0.0f);
      for (int64_t j = offsets[b]; j < offsets[b + 1]; ++j) {
        const float w = weights[j];
        const float* row = table + static_cast<int64_t>(idx[j]) * width;
        for (int64_t c = 0; c < width; ++c) o[c] += w * row[c];
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoEmbeddingBagBackward(int64_t bags, int64_t width, int64_t nnz,
                                                const int32_t* offsets, const int32_t* idx,
                                                const float* weights, const float* dout,
                                                int64_t table_rows, float* dtable) {
  constexpr const char* op = "EmbeddingBagBackward";
  if (absl::Status s = CheckOffsets(op, offsets, bags, nnz); !s.ok()) return s;
  if (absl::Status s = CheckIndices(op, idx + offsets[0], offsets[bags] - offsets[0], table_rows);
      !s.ok()) {
    return s;
  }
  auto add = [&](int64_t c0, int64_t c1) {
    for (int64_t b = 0; b < bags; ++b) {
      const float* d = dout + b * width;
      for (int64_t j = offsets[b]; j < offsets[b + 1]; ++j) {
        const float w = weights[j];
        float* t = dtable + static_cast<int64_t>(idx[j]) * width;
        for (int64_t c = c0; c < c1; ++c) t[c] += w * d[c];
      }
    }
  };
  const int64_t work = (offsets[bags] - offsets[0]) * width;
  if (width >= 2 * kMinColumnSlice && work >= 2 * kElementGrain) {
    pool_.ParallelFor(width, kMinColumnSlice, add);
  } else {
    add(0, width);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::DoCastToHalf(HalfType type, int64_t n, const float* x, uint16_t* y) {
  pool_.ParallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
    if (type == HalfType::kFloat16) {
      for (int64_t i = b; i < e; ++i) y[i] = FloatToHalfBits(x[i]);
    } else {
      for (int64_t i = b; i < e; ++i) y[i] = FloatToBFloat16Bits(x[i]);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoCastFromHalf(HalfType type, int64_t n, const uint16_t* x, float* y) {
  pool_.ParallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
    if (type == HalfType::kFloat16) {
      for (int64_t i = b; i < e; ++i) y[i] = HalfBitsToFloat(x[i]);
    } else {
      for (int64_t i = b; i < e; ++i) y[i] = BFloat16BitsToFloat(x[i]);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::DoTopKAbs(int64_t n, const float* x, int64_t k, int32_t* out_idx,
                                   float* out_val) {
  // The k-th largest key is the threshold: every key above it is selected, and the lowest-index
  // keys equal to it fill the remaining places.
  topk_keys_.resize(n);
  for (int64_t i = 0; i < n; ++i) topk_keys_[i] = AbsKey(x[i]);
  std::nth_element(topk_keys_.begin(), topk_keys_.begin() + (k - 1), topk_keys_.end(),
                   std::greater<uint32_t>());
  const uint32_t threshold = topk_keys_[k - 1];
  int64_t above = 0;
  for (int64_t i = 0; i < n; ++i) above += AbsKey(x[i]) > threshold;
  int64_t ties_left = k - above;
  int64_t out = 0;
  for (int64_t i = 0; i < n && out < k; ++i) {
    const uint32_t key = AbsKey(x[i]);
    if (key > threshold || (key == threshold && ties_left-- > 0)) {
      out_idx[out] = static_cast<int32_t>(i);
      if (out_val != nullptr) out_val[out] = x[i];
      ++out;
    }
  }
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
