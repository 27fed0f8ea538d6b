#include "worker/data/text_scan.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <system_error>

#include "absl/strings/charconv.h"
#include "common/sharding.h"

namespace pscluster::data {
namespace {

inline bool IsDigit(char c) { return static_cast<unsigned char>(c - '0') < 10; }

// Powers of ten exact in float (5^10 < 2^24).
constexpr float kPow10[] = {1e0f, 1e1f, 1e2f, 1e3f, 1e4f, 1e5f, 1e6f, 1e7f, 1e8f, 1e9f, 1e10f};

}  // namespace

bool ScanFloat(const char** pp, const char* end, float* out) {
  const char* p = *pp;
  bool neg = false;
  if (p < end && (*p == '-' || *p == '+')) {
    neg = *p == '-';
    ++p;
  }
  const char* digits_start = p;
  // The fast path: at most 7 significant digits (below 2^24) and a power of ten in [-10, 10]:
  // one float multiply or divide of two exact values, rounded once as strtof rounds.
  uint32_t m = 0;
  int sig = 0, exp10 = 0;
  bool any = false, slow = false;
  for (; p < end && IsDigit(*p); ++p) {
    any = true;
    if (m != 0 || *p != '0') {
      if (++sig > 7) {
        slow = true;
      } else {
        m = m * 10 + (*p - '0');
      }
    }
  }
  if (p < end && *p == '.') {
    ++p;
    for (; p < end && IsDigit(*p); ++p) {
      any = true;
      if (m != 0 || *p != '0') {
        if (++sig > 7) slow = true;
      }
      if (!slow) {
        m = m * 10 + (*p - '0');
        --exp10;
      }
    }
  }
  if (!any) return false;
  if (p < end && (*p == 'e' || *p == 'E')) {
    const char* q = p + 1;
    bool eneg = false;
    if (q < end && (*q == '-' || *q == '+')) eneg = *q++ == '-';
    if (q < end && IsDigit(*q)) {
      int e = 0;
      for (; q < end && IsDigit(*q); ++q) {
        if (e < 100000) e = e * 10 + (*q - '0');
      }
      exp10 += eneg ? -e : e;
      p = q;
    }
  }
  if (!slow && exp10 >= -10 && exp10 <= 10) {
    float f = static_cast<float>(m);
    f = exp10 < 0 ? f / kPow10[-exp10] : f * kPow10[exp10];
    *out = neg ? -f : f;
    *pp = p;
    return true;
  }
  // Everything else: Abseil's exact conversion over the same characters.
  float f = 0;
  absl::from_chars_result r = absl::from_chars(digits_start, p, f);
  if (r.ec == std::errc::result_out_of_range) {
    double d = 0;
    r = absl::from_chars(digits_start, p, d);
    if (r.ec != std::errc() || !(std::fabs(d) <= std::numeric_limits<float>::max())) return false;
    f = static_cast<float>(d);
  } else if (r.ec != std::errc()) {
    return false;
  }
  if (r.ptr != p || !std::isfinite(f)) return false;
  *out = neg ? -f : f;
  *pp = p;
  return true;
}

bool ScanUint64(const char** pp, const char* end, uint64_t* out) {
  const char* p = *pp;
  uint64_t v = 0;
  if (p >= end || !IsDigit(*p)) return false;
  for (; p < end && IsDigit(*p); ++p) {
    const uint64_t d = static_cast<uint64_t>(*p - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  *pp = p;
  return true;
}

bool ScanInt64(const char** pp, const char* end, int64_t* out) {
  const char* p = *pp;
  bool neg = false;
  if (p < end && (*p == '-' || *p == '+')) {
    neg = *p == '-';
    ++p;
  }
  uint64_t v = 0;
  if (!ScanUint64(&p, end, &v)) return false;
  const uint64_t limit = uint64_t{std::numeric_limits<int64_t>::max()} + (neg ? 1 : 0);
  if (v > limit) return false;
  *out = neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
  *pp = p;
  return true;
}

uint64_t HashBytes(absl::string_view s, uint64_t seed) {
  const char* p = s.data();
  size_t n = s.size();
  uint64_t h = Mix64(seed ^ (uint64_t{n} * 0x9e3779b97f4a7c15ULL));
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0x94d049bb133111ebULL;
  }
  return Mix64(h);
}

absl::string_view TokenAt(const char* p, const char* end, char stop, size_t max) {
  const char* q = p;
  while (q < end && *q != '\t' && *q != ' ' && (stop == '\0' || *q != stop) &&
         static_cast<size_t>(q - p) < max) {
    ++q;
  }
  return absl::string_view(p, static_cast<size_t>(q - p));
}

}  // namespace pscluster::data
