#include "server/embedding_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/sharding.h"

namespace pscluster {

CountMinSketch::CountMinSketch(uint64_t bytes)
    : width_(std::max<uint64_t>(64, bytes / (kDepth * sizeof(uint32_t)))),
      counters_(new std::atomic<uint32_t>[kDepth * width_]) {
  for (uint64_t i = 0; i < kDepth * width_; ++i) counters_[i].store(0, std::memory_order_relaxed);
}

uint64_t CountMinSketch::Cell(int row, uint64_t key) const {
  return static_cast<uint64_t>(row) * width_ +
         Mix64(key + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(row + 1)) % width_;
}

uint32_t CountMinSketch::Add(uint64_t key) {
  uint32_t est = std::numeric_limits<uint32_t>::max();
  for (int r = 0; r < kDepth; ++r) {
    std::atomic<uint32_t>& c = counters_[Cell(r, key)];
    uint32_t v = c.load(std::memory_order_relaxed);
    // Saturating: a counter stays at its maximum instead of wrapping.
    while (v != std::numeric_limits<uint32_t>::max() &&
           !c.compare_exchange_weak(v, v + 1, std::memory_order_relaxed)) {
    }
    est = std::min(est, v == std::numeric_limits<uint32_t>::max() ? v : v + 1);
  }
  return est;
}

void CountMinSketch::AppendTo(std::string* out) const {
  const size_t at = out->size();
  out->resize(at + bytes());
  char* p = out->data() + at;
  for (uint64_t i = 0; i < kDepth * width_; ++i) {
    const uint32_t v = counters_[i].load(std::memory_order_relaxed);
    for (int b = 0; b < 4; ++b) p[4 * i + b] = static_cast<char>((v >> (8 * b)) & 0xff);
  }
}

absl::Status CountMinSketch::AddFrom(absl::string_view counters) {
  if (counters.size() != bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("an admission sketch of ", counters.size(),
                                                   " bytes does not fit this table's ", bytes()));
  }
  const unsigned char* p = reinterpret_cast<const unsigned char*>(counters.data());
  for (uint64_t i = 0; i < kDepth * width_; ++i) {
    const uint32_t add = static_cast<uint32_t>(p[4 * i]) | static_cast<uint32_t>(p[4 * i + 1]) << 8 |
                         static_cast<uint32_t>(p[4 * i + 2]) << 16 |
                         static_cast<uint32_t>(p[4 * i + 3]) << 24;
    std::atomic<uint32_t>& c = counters_[i];
    uint32_t v = c.load(std::memory_order_relaxed);
    uint32_t sum;
    do {
      sum = add > std::numeric_limits<uint32_t>::max() - v ? std::numeric_limits<uint32_t>::max()
                                                            : v + add;
    } while (!c.compare_exchange_weak(v, sum, std::memory_order_relaxed));
  }
  return absl::OkStatus();
}

uint32_t CountMinSketch::Estimate(uint64_t key) const {
  uint32_t est = std::numeric_limits<uint32_t>::max();
  for (int r = 0; r < kDepth; ++r) {
    est = std::min(est, counters_[Cell(r, key)].load(std::memory_order_relaxed));
  }
  return est;
}

EmbeddingPolicy::EmbeddingPolicy(const v1::EmbeddingSpec& spec, uint64_t table_hash,
                                 uint64_t seed)
    : after_pushes_(spec.admit_after_pushes()),
      probability_(spec.admit_probability()),
      draw_seed_(Mix64(seed ^ Mix64(table_hash))),
      expire_steps_(static_cast<int64_t>(spec.expire_after_steps())),
      expire_ms_(static_cast<int64_t>(spec.expire_after_seconds()) * 1000) {
  if (after_pushes_ > 1) {
    admits_ = true;
    sketch_ = std::make_unique<CountMinSketch>(
        spec.admit_sketch_bytes() ? spec.admit_sketch_bytes() : kDefaultSketchBytes);
  } else if (probability_ > 0.f && probability_ < 1.f) {
    admits_ = true;
  }
}

bool EmbeddingPolicy::Admit(uint64_t key, int64_t step) {
  if (sketch_ != nullptr) return sketch_->Add(key) >= after_pushes_;
  if (!admits_) return true;
  // A uniform draw in [0, 1) from (seed, table, key, step): the same on every copy.
  const uint64_t h = Mix64(draw_seed_ ^ Mix64(key ^ Mix64(static_cast<uint64_t>(step))));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < static_cast<double>(probability_);
}

bool EmbeddingPolicy::Expired(int64_t last_step, int64_t last_ms, int64_t step,
                              int64_t now_ms) const {
  if (expire_steps_ > 0 && step - last_step > expire_steps_) return true;
  if (expire_ms_ > 0 && now_ms - last_ms > expire_ms_) return true;
  return false;
}

bool EmbeddingPolicy::Collectable(int64_t last_step, int64_t last_ms, int64_t min_clock,
                                  int64_t now_ms) const {
  if (expire_steps_ > 0 && min_clock - last_step > expire_steps_) return true;
  if (expire_ms_ > 0 && now_ms - last_ms > 2 * expire_ms_ + 60000) return true;
  return false;
}

absl::Status ValidateEmbedding(const v1::EmbeddingSpec& spec, v1::TableKind kind,
                               absl::string_view field) {
  auto bad = [&](absl::string_view member, absl::string_view why) {
    return absl::InvalidArgumentError(
        member.empty() ? absl::StrCat(field, ": ", why) : absl::StrCat(field, ".", member, ": ", why));
  };
  const bool any = spec.admit_after_pushes() != 0 || spec.admit_sketch_bytes() != 0 ||
                   spec.admit_probability() != 0.f || spec.expire_after_steps() != 0 ||
                   spec.expire_after_seconds() != 0;
  if (!any) return absl::OkStatus();
  if (kind != v1::SPARSE) {
    return bad("", "admission and expiry apply to sparse (embedding) tables only");
  }
  if (spec.admit_after_pushes() > 1000000) {
    return bad("admit_after_pushes", absl::StrCat("must be at most 1000000 (got ",
                                                  spec.admit_after_pushes(), ")"));
  }
  if (spec.admit_sketch_bytes() != 0 && spec.admit_after_pushes() <= 1) {
    return bad("admit_sketch_bytes", "applies only with admit_after_pushes >= 2");
  }
  if (spec.admit_sketch_bytes() != 0 &&
      (spec.admit_sketch_bytes() < 1024 || spec.admit_sketch_bytes() > (uint64_t{1} << 34))) {
    return bad("admit_sketch_bytes", absl::StrCat("must be in [1024, 17179869184] (got ",
                                                  spec.admit_sketch_bytes(), ")"));
  }
  const float p = spec.admit_probability();
  if (!std::isfinite(p) || p < 0.f || p > 1.f) {
    return bad("admit_probability", absl::StrCat("must be in (0, 1], or 0 for off (got ", p, ")"));
  }
  if (p != 0.f && spec.admit_after_pushes() != 0) {
    return bad("admit_probability", "cannot be combined with admit_after_pushes (choose one filter)");
  }
  constexpr uint64_t kMaxExpiry = uint64_t{1} << 40;
  if (spec.expire_after_steps() > kMaxExpiry) {
    return bad("expire_after_steps", absl::StrCat("must be at most ", kMaxExpiry));
  }
  if (spec.expire_after_seconds() > kMaxExpiry / 1000) {
    return bad("expire_after_seconds", absl::StrCat("must be at most ", kMaxExpiry / 1000));
  }
  return absl::OkStatus();
}

}  // namespace pscluster
