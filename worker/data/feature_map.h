// How a categorical value becomes a key, and the dense transform; shared by the csv/tsv and
// criteo parsers so that the same value in the same field gets the same key in both.
#ifndef PSCLUSTER_WORKER_DATA_FEATURE_MAP_H_
#define PSCLUSTER_WORKER_DATA_FEATURE_MAP_H_

#include <cmath>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "worker/data/example.h"
#include "worker/data/text_scan.h"

namespace pscluster::data {

inline constexpr uint64_t kCategoricalHashSeed = 0x6c62272e07bb0142ULL;

// The key of `value` in `field`: the field's first key for a missing value, else one of the
// other size - 1 keys by a stable hash of the bytes. REQUIRES: field.size >= 2.
inline uint64_t CategoricalKey(const FieldInfo& field, absl::string_view value, bool missing) {
  if (missing) return field.base;
  return field.base + 1 + HashBytes(value, kCategoricalHashSeed) % (field.size - 1);
}

// sign(x) * log(1 + |x|).
inline float Log1pSigned(float x) { return x >= 0 ? std::log1p(x) : -std::log1p(-x); }

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_FEATURE_MAP_H_
