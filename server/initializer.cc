#include "server/initializer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/sharding.h"

namespace pscluster {
namespace {

// Uniform in [0, 1) from 24 high bits (exactly representable in a float).
inline double Unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

}  // namespace

void Fans(const v1::TableSpec& table, double* fan_in, double* fan_out) {
  if (table.kind() == v1::SPARSE) {
    *fan_in = *fan_out = table.row_width() > 0 ? table.row_width() : 1;
    return;
  }
  const auto& d = table.shape().dims();
  if (d.empty()) {
    *fan_in = *fan_out = 1;
  } else if (d.size() == 1) {
    *fan_in = *fan_out = static_cast<double>(d[0]);
  } else {
    double receptive = 1;
    for (int i = 2; i < d.size(); ++i) receptive *= static_cast<double>(d[i]);
    *fan_in = static_cast<double>(d[1]) * receptive;
    *fan_out = static_cast<double>(d[0]) * receptive;
  }
}

Initializer::Initializer(const v1::TableSpec& spec)
    : kind_(spec.init().kind()), seed_(Mix64(spec.init().seed() ^ TableHash(spec.name()))) {
  const auto& init = spec.init();
  double fan_in, fan_out;
  Fans(spec, &fan_in, &fan_out);
  switch (kind_) {
    case v1::InitializerSpec::CONSTANT:
      a_ = init.value();
      break;
    case v1::InitializerSpec::UNIFORM:
      a_ = init.low();
      b_ = init.high();
      break;
    case v1::InitializerSpec::NORMAL:
      a_ = init.mean();
      b_ = init.stddev();
      break;
    case v1::InitializerSpec::GLOROT_UNIFORM: {
      float limit = static_cast<float>(std::sqrt(6.0 / (fan_in + fan_out)));
      a_ = -limit;
      b_ = limit;
      break;
    }
    case v1::InitializerSpec::HE_NORMAL:
      a_ = 0.f;
      b_ = static_cast<float>(std::sqrt(2.0 / fan_in));
      break;
    default:
      break;
  }
}

float Initializer::Draw(uint64_t h) const {
  switch (kind_) {
    case v1::InitializerSpec::CONSTANT:
      return a_;
    case v1::InitializerSpec::UNIFORM:
    case v1::InitializerSpec::GLOROT_UNIFORM:
      return static_cast<float>(a_ + (static_cast<double>(b_) - a_) * Unit(Mix64(h)));
    case v1::InitializerSpec::NORMAL:
    case v1::InitializerSpec::HE_NORMAL: {
      // Box-Muller on two independent hashes; 1 - u keeps the logarithm finite.
      double u1 = 1.0 - Unit(Mix64(h));
      double u2 = Unit(Mix64(h ^ 0x632be59bd9b4e019ULL));
      double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
      return static_cast<float>(a_ + b_ * z);
    }
    default:
      return 0.f;
  }
}

void Initializer::FillDense(uint64_t first, size_t n, float* out) const {
  if (kind_ == v1::InitializerSpec::ZEROS || kind_ == v1::InitializerSpec::CONSTANT) {
    for (size_t i = 0; i < n; ++i) out[i] = kind_ == v1::InitializerSpec::ZEROS ? 0.f : a_;
    return;
  }
  for (size_t i = 0; i < n; ++i) out[i] = Draw(seed_ ^ Mix64(first + i));
}

void Initializer::FillRow(uint64_t key, size_t width, float* out) const {
  if (kind_ == v1::InitializerSpec::ZEROS || kind_ == v1::InitializerSpec::CONSTANT) {
    for (size_t i = 0; i < width; ++i) out[i] = kind_ == v1::InitializerSpec::ZEROS ? 0.f : a_;
    return;
  }
  const uint64_t row = seed_ + 0x9e3779b97f4a7c15ULL * Mix64(key ^ 0x5851f42d4c957f2dULL);
  for (size_t i = 0; i < width; ++i) out[i] = Draw(row ^ Mix64(i));
}

absl::Status ValidateInitializer(const v1::TableSpec& table, absl::string_view field) {
  const auto& init = table.init();
  auto bad = [&](absl::string_view member, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".", member, ": ", why));
  };
  switch (init.kind()) {
    case v1::InitializerSpec::ZEROS:
    case v1::InitializerSpec::GLOROT_UNIFORM:
    case v1::InitializerSpec::HE_NORMAL:
      return absl::OkStatus();
    case v1::InitializerSpec::CONSTANT:
      if (!std::isfinite(init.value())) return bad("value", "must be finite");
      return absl::OkStatus();
    case v1::InitializerSpec::UNIFORM:
      if (!std::isfinite(init.low()) || !std::isfinite(init.high()) || !(init.low() < init.high())) {
        return bad("low", absl::StrCat("need finite low < high, got [", init.low(), ", ",
                                       init.high(), ")"));
      }
      return absl::OkStatus();
    case v1::InitializerSpec::NORMAL:
      if (!std::isfinite(init.mean())) return bad("mean", "must be finite");
      if (!std::isfinite(init.stddev()) || init.stddev() <= 0.f) {
        return bad("stddev", absl::StrCat("must be finite and > 0, got ", init.stddev()));
      }
      return absl::OkStatus();
    default:
      return bad("kind", absl::StrCat("unknown initializer ", init.kind()));
  }
}

}  // namespace pscluster
