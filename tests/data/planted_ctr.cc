#include "tests/data/planted_ctr.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/sharding.h"

namespace pscluster::testdata {
namespace {

constexpr double kTwoPi = 6.283185307179586;

// A standard normal from a hash (Box-Muller over two hashed uniforms).
double NormalFrom(uint64_t h) {
  const double u1 = (static_cast<double>(Mix64(h) >> 11) + 1.0) * 0x1p-53;  // (0, 1]
  const double u2 = static_cast<double>(Mix64(h ^ 0xa0761d6478bd642fULL) >> 11) * 0x1p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

// Missing-value rate of each categorical field and dense feature.
double CategoricalMissing(int f) { return f % 5 == 2 ? 0.08 : 0.0; }
double DenseMissing(int j) { return 0.1 * (j % 3); }

}  // namespace

uint64_t Rng::Next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  return Mix64(state_);
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1p-53; }

double Rng::Normal() {
  const double u1 = 1.0 - Uniform();  // (0, 1]
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * Uniform());
}

ZipfSampler::ZipfSampler(uint64_t n, double s) : n_(n), s_(s) {
  h_integral_x1_ = HIntegral(1.5) - 1.0;
  h_integral_n_ = HIntegral(static_cast<double>(n_) + 0.5);
  s_val_ = 2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0));
}

double ZipfSampler::H(double x) const { return std::exp(-s_ * std::log(x)); }

// (x^(1-s) - 1) / (1 - s), and log(x) at s = 1, computed without cancellation.
double ZipfSampler::HIntegral(double x) const {
  const double log_x = std::log(x);
  const double t = (1.0 - s_) * log_x;
  const double helper =
      std::fabs(t) > 1e-8 ? std::expm1(t) / t : 1.0 + t * 0.5 * (1.0 + t / 3.0 * (1.0 + 0.25 * t));
  return helper * log_x;
}

double ZipfSampler::HIntegralInverse(double x) const {
  double t = x * (1.0 - s_);
  if (t < -1.0) t = -1.0;
  const double helper =
      std::fabs(t) > 1e-8 ? std::log1p(t) / t : 1.0 - t * (0.5 - t * (1.0 / 3.0 - 0.25 * t));
  return std::exp(helper * x);
}

uint64_t ZipfSampler::Sample(Rng& rng) const {
  while (true) {
    const double u = h_integral_n_ + rng.Uniform() * (h_integral_x1_ - h_integral_n_);
    const double x = HIntegralInverse(u);
    double k = std::floor(x + 0.5);
    if (k < 1) k = 1;
    if (k > static_cast<double>(n_)) k = static_cast<double>(n_);
    if (k - x <= s_val_ || u >= HIntegral(k + 0.5) - H(k)) return static_cast<uint64_t>(k);
  }
}

PlantedCtrModel::PlantedCtrModel(const PlantedOptions& options) : options_(options) {
  // Sizes over four decades: field f's share is 10^(4 u_f), u_f spread over [0, 1].
  double shares[kFields], total = 0;
  for (int f = 0; f < kFields; ++f) {
    shares[f] = std::pow(10.0, 4.0 * ((f * 7) % kFields) / (kFields - 1.0));
    total += shares[f];
  }
  for (int f = 0; f < kFields; ++f) {
    const uint64_t size = static_cast<uint64_t>(
        std::llround(static_cast<double>(options_.total_keys) * shares[f] / total));
    sizes_.push_back(std::max<uint64_t>(2, size));
    zipf_.emplace_back(sizes_.back(), options_.zipf_exponent);
  }
  for (int j = 0; j < kDense; ++j) {
    dense_weight_[j] = options_.dense_scale * NormalFrom(Mix64(options_.seed ^ 0xd0) + j);
  }
}

uint64_t PlantedCtrModel::total_keys() const {
  uint64_t t = 0;
  for (uint64_t s : sizes_) t += s;
  return t;
}

void PlantedCtrModel::Draw(Rng& rng, PlantedRow* row) const {
  for (int j = 0; j < kDense; ++j) {
    row->dense_missing[j] = rng.Uniform() < DenseMissing(j);
    const double v = std::floor(std::exp(0.3 + 0.25 * j + 1.2 * rng.Normal())) - 1.0;
    row->dense[j] = row->dense_missing[j] ? 0 : static_cast<int64_t>(std::max(0.0, v));
  }
  for (int f = 0; f < kFields; ++f) {
    const bool missing = rng.Uniform() < CategoricalMissing(f);
    row->rank[f] = missing ? 0 : static_cast<uint32_t>(zipf_[f].Sample(rng));
  }
}

double PlantedCtrModel::Weight(int f, uint32_t rank) const {
  const uint64_t h = Mix64(options_.seed ^ Mix64((uint64_t(f) + 1) << 40 | rank));
  const double decay = rank == 0 ? 1.0 : 1.0 / (1.0 + double(rank) / options_.signal_ranks);
  return options_.weight_scale * decay * NormalFrom(h);
}

void PlantedCtrModel::Factor(int f, uint32_t rank, double* out) const {
  const uint64_t h = Mix64(~options_.seed ^ Mix64((uint64_t(f) + 1) << 40 | rank));
  const double decay = rank == 0 ? 1.0 : 1.0 / (1.0 + double(rank) / options_.signal_ranks);
  for (uint32_t k = 0; k < options_.factor_dim; ++k) {
    out[k] = options_.factor_scale * decay * NormalFrom(h + k + 1);
  }
}

double PlantedCtrModel::Logit(const PlantedRow& row) const {
  double z = options_.bias;
  for (int j = 0; j < kDense; ++j) {
    if (!row.dense_missing[j]) z += dense_weight_[j] * std::log1p(double(row.dense[j]));
  }
  for (int f = 0; f < kFields; ++f) z += Weight(f, row.rank[f]);
  if (options_.kind == PlantedKind::kFm) {
    // sum_{f<g} <e_f, e_g> = (|sum_f e_f|^2 - sum_f |e_f|^2) / 2.
    std::vector<double> sum(options_.factor_dim, 0.0), e(options_.factor_dim);
    double squares = 0;
    for (int f = 0; f < kFields; ++f) {
      Factor(f, row.rank[f], e.data());
      for (uint32_t k = 0; k < options_.factor_dim; ++k) {
        sum[k] += e[k];
        squares += e[k] * e[k];
      }
    }
    double norm = 0;
    for (double s : sum) norm += s * s;
    z += 0.5 * (norm - squares);
  }
  return z;
}

uint32_t PlantedCtrModel::ValueId(int f, uint32_t rank) const {
  // A bijection on 32 bits (xor, odd multiplies and xor-shifts are each invertible).
  uint32_t x = rank ^ static_cast<uint32_t>(Mix64(options_.seed + f));
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

void PlantedCtrModel::AppendLine(const PlantedRow& row, int label, std::string* out) const {
  absl::StrAppend(out, label);
  for (int j = 0; j < kDense; ++j) {
    out->push_back('\t');
    if (!row.dense_missing[j]) absl::StrAppend(out, row.dense[j]);
  }
  for (int f = 0; f < kFields; ++f) {
    out->push_back('\t');
    if (row.rank[f] != 0) absl::StrAppend(out, absl::Hex(ValueId(f, row.rank[f]), absl::kZeroPad8));
  }
  out->push_back('\n');
}

double ExactAuc(std::vector<std::pair<double, int>> scored) {
  std::sort(scored.begin(), scored.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  double pos = 0, neg = 0, rank_sum = 0;
  for (size_t i = 0; i < scored.size();) {
    size_t j = i;
    double group_pos = 0;
    while (j < scored.size() && scored[j].first == scored[i].first) group_pos += scored[j++].second;
    // Ranks i+1..j share their mean.
    rank_sum += group_pos * (static_cast<double>(i + 1 + j) / 2.0);
    pos += group_pos;
    neg += static_cast<double>(j - i) - group_pos;
    i = j;
  }
  if (pos == 0 || neg == 0) return 0.5;
  return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg);
}

}  // namespace pscluster::testdata
