// A synthetic click-through set drawn from a planted model, written in Criteo's format (label,
// 13 integer counts, 26 categorical fields as 8 hex digits), so that a trained model can be
// compared with the truth: the planted model's own AUC on the test split is the ceiling.
//
// Field f has field_size(f) values (sizes spread over four decades, 10^6-10^7 values in all by
// default); an example draws each field's value by rank from a Zipf law, and some fields are
// missing in some examples. The planted logit is
//   bias + sum_j u_j log1p(x_j) + sum_f w(f, v_f) [+ sum_{f<g} <e(f, v_f), e(g, v_g)>  (FM)]
// with every weight a pseudo-random normal drawn from a hash of (seed, field, value): nothing is
// stored, so memory does not grow with the number of keys. Weights of rarer values are smaller
// (by 1 / (1 + rank / signal_ranks)), so the signal sits where a model can learn it.
#ifndef PSCLUSTER_TESTS_DATA_PLANTED_CTR_H_
#define PSCLUSTER_TESTS_DATA_PLANTED_CTR_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pscluster::testdata {

inline constexpr int kDense = 13;
inline constexpr int kFields = 26;

// splitmix64: deterministic on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  double Uniform();  // [0, 1)
  double Normal();

 private:
  uint64_t state_;
};

// Zipf law over ranks 1..n with exponent s > 0, by rejection-inversion (Hörmann and Derflinger
// 1996): O(1) memory and time per draw whatever n.
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double s);
  uint64_t Sample(Rng& rng) const;  // In [1, n].

 private:
  double H(double x) const;
  double HIntegral(double x) const;
  double HIntegralInverse(double x) const;

  uint64_t n_;
  double s_;
  double h_integral_x1_, h_integral_n_, s_val_;
};

enum class PlantedKind { kFm, kLinear };

struct PlantedOptions {
  PlantedKind kind = PlantedKind::kFm;
  uint64_t seed = 1;
  uint64_t total_keys = 3000000;  // Values over all 26 fields.
  double zipf_exponent = 1.1;
  uint32_t factor_dim = 4;  // FM: width of e(f, v).
  uint32_t signal_ranks = 1000;
  double bias = -1.2;
  double dense_scale = 0.15;   // Std of u_j.
  double weight_scale = 0.25;  // Std of w(f, v) for frequent values.
  double factor_scale = 0.17;  // Std of each entry of e(f, v) for frequent values.
};

struct PlantedRow {
  int64_t dense[kDense];
  bool dense_missing[kDense];
  uint32_t rank[kFields];  // 0 = missing; else 1..field_size(f).
};

class PlantedCtrModel {
 public:
  explicit PlantedCtrModel(const PlantedOptions& options);

  uint64_t field_size(int f) const { return sizes_[f]; }
  uint64_t total_keys() const;

  void Draw(Rng& rng, PlantedRow* row) const;
  double Logit(const PlantedRow& row) const;
  // Appends the row's Criteo line (with '\n').
  void AppendLine(const PlantedRow& row, int label, std::string* out) const;
  // The 8 hex digits that stand for value `rank` of field f (distinct for distinct ranks).
  uint32_t ValueId(int f, uint32_t rank) const;

 private:
  double Weight(int f, uint32_t rank) const;
  void Factor(int f, uint32_t rank, double* out) const;

  PlantedOptions options_;
  std::vector<uint64_t> sizes_;
  std::vector<ZipfSampler> zipf_;
  double dense_weight_[kDense];
};

// The exact area under the ROC curve of (score, label) pairs, ties counted half. 0.5 when one
// class is absent.
double ExactAuc(std::vector<std::pair<double, int>> scored);

}  // namespace pscluster::testdata

#endif  // PSCLUSTER_TESTS_DATA_PLANTED_CTR_H_
