#include "common/grad_compress.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/half_bits.h"

namespace pscluster {

uint64_t TopKCount(uint64_t n, float ratio) {
  if (n == 0) return 0;
  // ratio is a float (0.2f is 0.2000000030): products within float precision of a whole number
  // round to it rather than up.
  const double exact = static_cast<double>(ratio) * static_cast<double>(n);
  const double k = std::ceil(exact * (1 - 1e-6));
  if (!(k >= 1)) return 1;
  return k >= static_cast<double>(n) ? n : static_cast<uint64_t>(k);
}

std::vector<uint32_t> SelectTopK(const float* x, uint64_t n, uint64_t k) {
  std::vector<uint32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0u);
  if (k < n) {
    // AbsKey orders |x| as an integer (NaN above infinity); the index breaks ties.
    auto before = [x](uint32_t a, uint32_t b) {
      const uint32_t ka = AbsKey(x[a]), kb = AbsKey(x[b]);
      return ka != kb ? ka > kb : a < b;
    };
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(), before);
    idx.resize(k);
  }
  std::sort(idx.begin(), idx.end());
  return idx;
}

void QuantizeInt8(const float* x, size_t n, size_t group, int8_t* q, float* scales) {
  for (size_t g = 0, first = 0; first < n; ++g, first += group) {
    const size_t end = std::min(n, first + group);
    float max_abs = 0.f;
    for (size_t i = first; i < end; ++i) {
      const float a = std::fabs(x[i]);
      // NaN and infinity poison the scale (the servers refuse it) rather than vanish.
      if (!(a <= max_abs)) max_abs = std::isnan(a) ? a : std::max(max_abs, a);
    }
    const float scale = max_abs / 127.f;
    scales[g] = scale;
    if (!(scale > 0.f) || !std::isfinite(scale)) {
      std::fill(q + first, q + end, int8_t{0});
      continue;
    }
    const float inv = 1.f / scale;
    for (size_t i = first; i < end; ++i) {
      const float v = std::nearbyint(x[i] * inv);
      q[i] = static_cast<int8_t>(std::clamp(v, -127.f, 127.f));
    }
  }
}

void DequantizeInt8(const int8_t* q, size_t n, size_t group, const float* scales, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]) * scales[i / group];
}

}  // namespace pscluster
