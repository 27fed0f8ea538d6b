#include "common/grad_compress.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>

#include "common/codec_simd.h"
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

namespace {

// SelectTopK's answer from a threshold guessed on a sample, when that works out (nullopt
// otherwise: too few or too many elements at or above it). About 2k/n of an evenly spaced sample
// of keys lie above the guess, so about 2k elements do: with high probability every one of the
// k largest, and few more. Those candidates are collected in one vector pass, and the k-th
// largest key among them is the k-th largest of all (at least k keys are at or above the guess,
// so it is too): the same threshold, ties and order as the radix select. REQUIRES: 0 < k < n.
std::optional<std::vector<uint32_t>> SelectTopKFromSample(const float* x, uint64_t n,
                                                           uint64_t k) {
  constexpr uint64_t kSample = 1024;
  if (!codec_simd::CpuHasAvx2F16C() || n < 4 * kSample || k * 16 > n || n >= (uint64_t{1} << 32)) {
    return std::nullopt;
  }
  std::vector<uint32_t> sample(kSample);
  for (uint64_t j = 0; j < kSample; ++j) sample[j] = AbsKey(x[j * n / kSample]);
  const uint64_t rank =
      std::min<uint64_t>(kSample, 8 + (2 * k * kSample + n - 1) / n);  // 1-based.
  std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(),
                   std::greater<uint32_t>());
  // Mostly zeros (a sparse update's difference, say): the candidates are the non-zero elements.
  const uint32_t guess = std::max<uint32_t>(sample[rank - 1], 1);
  const size_t cap = static_cast<size_t>(4 * k + 64);
  std::vector<uint32_t> cand(cap);
  const size_t found = codec_simd::CollectAbsKeysAtLeast(x, n, guess, cand.data(), cap);
  if (found > cap) return std::nullopt;
  if (found < k) {
    if (guess != 1) return std::nullopt;
    // Fewer than k non-zero elements: all of them, and the lowest-indexed zeros (+0 and -0 tie)
    // up to k.
    std::vector<uint32_t> idx;
    idx.reserve(k);
    uint64_t zeros = k - found;
    size_t c = 0;
    for (uint32_t i = 0; idx.size() < k; ++i) {
      if (c < found && cand[c] == i) {
        idx.push_back(i);
        ++c;
      } else if (zeros > 0) {
        idx.push_back(i);
        --zeros;
      }
    }
    return idx;
  }
  cand.resize(found);
  std::vector<uint32_t> keys(found);
  for (size_t i = 0; i < found; ++i) keys[i] = AbsKey(x[cand[i]]);
  std::vector<uint32_t> ranked = keys;
  std::nth_element(ranked.begin(), ranked.begin() + (k - 1), ranked.end(),
                   std::greater<uint32_t>());
  const uint32_t threshold = ranked[k - 1];
  uint64_t above = 0;
  for (uint32_t key : keys) above += key > threshold;
  uint64_t ties_left = k - above;
  std::vector<uint32_t> idx;
  idx.reserve(k);
  for (size_t i = 0; i < found; ++i) {
    if (keys[i] > threshold || (keys[i] == threshold && ties_left > 0 && ties_left--)) {
      idx.push_back(cand[i]);
    }
  }
  return idx;
}

}  // namespace

std::vector<uint32_t> SelectTopK(const float* x, uint64_t n, uint64_t k) {
  if (k > 0 && k < n) {
    if (auto fast = SelectTopKFromSample(x, n, k); fast.has_value()) return *std::move(fast);
  }
  return SelectTopKRadix(x, n, k);  // Which also answers k = 0 and k >= n.
}

std::vector<uint32_t> SelectTopKRadix(const float* x, uint64_t n, uint64_t k) {
  std::vector<uint32_t> idx;
  if (k >= n) {
    idx.resize(n);
    std::iota(idx.begin(), idx.end(), 0u);
    return idx;
  }
  if (k == 0) return idx;
  // AbsKey orders |x| as an integer (NaN above infinity). The k-th largest key is the threshold:
  // every element above it is taken, and of those equal to it the lowest indices fill up to k
  // (the order "larger key, then lower index" that a full sort would give). The threshold is
  // found as a radix select: a histogram of the keys' top bits names the bucket that holds it,
  // and only that bucket's keys are ordered.
  constexpr int kLowBits = 20;  // Keys are < 2^31: 2048 buckets.
  std::vector<uint64_t> hist(uint64_t{1} << (31 - kLowBits), 0);
  for (uint64_t i = 0; i < n; ++i) ++hist[AbsKey(x[i]) >> kLowBits];
  uint64_t above = 0;  // Keys in buckets above `bucket`.
  uint32_t bucket = static_cast<uint32_t>(hist.size() - 1);
  while (above + hist[bucket] < k) above += hist[bucket--];
  std::vector<uint32_t> keys;
  keys.reserve(hist[bucket]);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t key = AbsKey(x[i]);
    if ((key >> kLowBits) == bucket) keys.push_back(key);
  }
  const uint64_t rank = k - above;  // 1-based, within the bucket.
  std::nth_element(keys.begin(), keys.begin() + (rank - 1), keys.end(), std::greater<uint32_t>());
  const uint32_t threshold = keys[rank - 1];
  for (uint64_t i = 0; i + 1 < rank; ++i) above += keys[i] > threshold;  // nth_element's front.
  uint64_t ties_left = k - above;
  idx.reserve(k);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t key = AbsKey(x[i]);
    if (key > threshold || (key == threshold && ties_left > 0 && ties_left--)) {
      idx.push_back(static_cast<uint32_t>(i));
    }
  }
  return idx;
}

void QuantizeInt8(const float* x, size_t n, size_t group, int8_t* q, float* scales) {
  if (!codec_simd::CpuHasAvx2F16C()) {
    QuantizeInt8Scalar(x, n, group, q, scales);
    return;
  }
  for (size_t g = 0, first = 0; first < n; ++g, first += group) {
    const size_t len = std::min(n, first + group) - first;
    const uint32_t key = codec_simd::MaxAbsKey(x + first, len);
    const float scale = BitsToFloat(key) / 127.f;
    const float inv = 1.f / scale;
    // A NaN in the group (its scale is the last NaN's, as the reference finds it), an infinite
    // or zero scale, or one too small to invert: the reference's own code for the group.
    if (key > 0x7f800000u || !(scale > 0.f) || !std::isfinite(scale) || !std::isfinite(inv)) {
      QuantizeInt8Scalar(x + first, len, len, q + first, scales + g);
      continue;
    }
    scales[g] = scale;
    codec_simd::QuantizeInt8Group(x + first, len, inv, q + first);
  }
}

void QuantizeInt8Scalar(const float* x, size_t n, size_t group, int8_t* q, float* scales) {
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
  if (!codec_simd::CpuHasAvx2F16C()) {
    DequantizeInt8Scalar(q, n, group, scales, out);
    return;
  }
  for (size_t g = 0, first = 0; first < n; ++g, first += group) {
    codec_simd::DequantizeInt8Group(q + first, std::min(n, first + group) - first, scales[g],
                                    out + first);
  }
}

void DequantizeInt8Scalar(const int8_t* q, size_t n, size_t group, const float* scales,
                          float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]) * scales[i / group];
}

}  // namespace pscluster
