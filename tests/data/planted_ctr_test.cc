#include "tests/data/planted_ctr.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "worker/data/criteo_parser.h"

namespace pscluster::testdata {
namespace {

double HarmonicS(uint64_t n, double s) {
  double h = 0;
  for (uint64_t k = n; k >= 1; --k) h += std::pow(static_cast<double>(k), -s);
  return h;
}

TEST(PlantedCtrTest, ZipfDrawsFollowTheLaw) {
  for (auto [n, s] :
       std::vector<std::pair<uint64_t, double>>{{1000, 1.1}, {50, 0.8}, {10000000, 1.1}}) {
    ZipfSampler zipf(n, s);
    Rng rng(3);
    constexpr int kDraws = 400000;
    std::vector<int> counts(6, 0);
    for (int i = 0; i < kDraws; ++i) {
      const uint64_t k = zipf.Sample(rng);
      ASSERT_GE(k, 1u);
      ASSERT_LE(k, n);
      if (k <= 5) ++counts[k];
    }
    const double h = HarmonicS(n, s);
    for (int k = 1; k <= 5; ++k) {
      const double p = std::pow(k, -s) / h;
      const double sigma = std::sqrt(kDraws * p * (1 - p));
      EXPECT_NEAR(counts[k], kDraws * p, 4 * sigma) << "n " << n << " s " << s << " rank " << k;
    }
  }
}

TEST(PlantedCtrTest, ExactAucMatchesCountingPairs) {
  Rng rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::pair<double, int>> scored;
    const int n = 2 + static_cast<int>(rng.Next() % 200);
    for (int i = 0; i < n; ++i) {
      // Few distinct scores: many ties.
      scored.emplace_back(static_cast<double>(rng.Next() % 20), static_cast<int>(rng.Next() % 2));
    }
    double wins = 0, pairs = 0;
    for (const auto& a : scored) {
      for (const auto& b : scored) {
        if (a.second == 1 && b.second == 0) {
          pairs += 1;
          wins += a.first > b.first ? 1.0 : (a.first == b.first ? 0.5 : 0.0);
        }
      }
    }
    const double want = pairs > 0 ? wins / pairs : 0.5;
    EXPECT_NEAR(ExactAuc(scored), want, 1e-12) << trial;
  }
}

TEST(PlantedCtrTest, FieldsSpreadOverDecadesAndValueIdsAreDistinct) {
  PlantedOptions o;
  o.total_keys = 5000000;
  PlantedCtrModel m(o);
  uint64_t lo = UINT64_MAX, hi = 0;
  for (int f = 0; f < kFields; ++f) {
    lo = std::min(lo, m.field_size(f));
    hi = std::max(hi, m.field_size(f));
  }
  EXPECT_NEAR(static_cast<double>(m.total_keys()), 5e6, 26);
  EXPECT_GT(hi, 1000 * lo);
  std::set<uint32_t> ids;
  for (uint32_t r = 1; r <= 200000; ++r) ids.insert(m.ValueId(3, r));
  EXPECT_EQ(ids.size(), 200000u);
}

std::vector<std::string> Lines(const PlantedOptions& o, uint64_t stream, int n) {
  PlantedCtrModel m(o);
  Rng rng(stream);
  PlantedRow row;
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string line;
    m.Draw(rng, &row);
    m.AppendLine(row, i % 2, &line);
    out.push_back(line);
  }
  return out;
}

TEST(PlantedCtrTest, TheSameSeedGivesTheSameLines) {
  PlantedOptions o;
  EXPECT_EQ(Lines(o, 1, 100), Lines(o, 1, 100));
  EXPECT_NE(Lines(o, 1, 100), Lines(o, 2, 100));
  PlantedOptions other = o;
  other.seed = 2;
  EXPECT_NE(Lines(o, 1, 100), Lines(other, 1, 100));
}

// The lines read back through the Criteo reader: labels, counts, missing cells, and one key per
// (field, value).
TEST(PlantedCtrTest, LinesReadBackThroughTheCriteoParser) {
  PlantedOptions o;
  o.total_keys = 200000;
  PlantedCtrModel m(o);
  data::DatasetOptions ro;
  ro.format = data::DataFormat::kCriteo;
  ro.hash_buckets = 1 << 22;
  data::CriteoParser parser(ro);
  Rng rng(9);
  PlantedRow row;
  std::map<std::pair<int, uint32_t>, uint64_t> key_of;
  int missing_cats = 0, missing_dense = 0;
  for (int i = 0; i < 3000; ++i) {
    m.Draw(rng, &row);
    std::string line;
    m.AppendLine(row, i % 3 == 0, &line);
    ASSERT_EQ(line.back(), '\n');
    line.pop_back();
    data::Example e;
    data::ParseError err;
    ASSERT_EQ(parser.Parse(line, &e, &err), data::ParseOutcome::kExample) << err.expected;
    EXPECT_EQ(e.label, i % 3 == 0 ? 1 : 0);
    for (int j = 0; j < kDense; ++j) {
      missing_dense += row.dense_missing[j];
      EXPECT_EQ(e.dense[j], row.dense_missing[j] ? 0.0f : static_cast<float>(row.dense[j]));
    }
    for (int f = 0; f < kFields; ++f) {
      if (row.rank[f] == 0) {
        ++missing_cats;
        EXPECT_EQ(e.keys[f], parser.schema().fields[f].base);
        continue;
      }
      auto [it, inserted] = key_of.emplace(std::make_pair(f, row.rank[f]), e.keys[f]);
      if (!inserted) {
        EXPECT_EQ(it->second, e.keys[f]);
      }
    }
  }
  EXPECT_GT(missing_cats, 0);
  EXPECT_GT(missing_dense, 0);
}

// The planted probabilities give labels at their own rate, the ceiling is a realistic click-
// through AUC, and the FM's pairwise term carries signal a linear model cannot reach.
TEST(PlantedCtrTest, PlantedAucAndTheFmTerm) {
  PlantedOptions fm;
  fm.total_keys = 1000000;
  PlantedOptions linear = fm;
  linear.kind = PlantedKind::kLinear;  // The same weights, without the pairwise term.
  PlantedCtrModel full(fm), first_order(linear);
  Rng rng(11);
  PlantedRow row;
  std::vector<std::pair<double, int>> by_full, by_linear;
  double expected_clicks = 0, clicks = 0;
  constexpr int kN = 60000;
  for (int i = 0; i < kN; ++i) {
    full.Draw(rng, &row);
    const double z = full.Logit(row);
    const double p = 1 / (1 + std::exp(-z));
    const int label = rng.Uniform() < p;
    expected_clicks += p;
    clicks += label;
    by_full.emplace_back(z, label);
    by_linear.emplace_back(first_order.Logit(row), label);
  }
  EXPECT_NEAR(clicks, expected_clicks, 4 * std::sqrt(expected_clicks));
  const double ceiling = ExactAuc(by_full), linear_auc = ExactAuc(by_linear);
  EXPECT_GT(ceiling, 0.70);
  EXPECT_LT(ceiling, 0.92);
  EXPECT_GT(ceiling, linear_auc + 0.02);
}

}  // namespace
}  // namespace pscluster::testdata
