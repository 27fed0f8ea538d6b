// Sparse rows of large embedding tables: pulls create nothing, admission (count and probability
// filters), expiry, and a copy following its primary's decisions.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "server/embedding_policy.h"
#include "server/table.h"
#include "server/testing/test_tables.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

constexpr uint32_t kWidth = 4;

struct Fixture {
  explicit Fixture(const v1::EmbeddingSpec& e, v1::OptimizerSpec::Kind kind = v1::OptimizerSpec::SGD,
                   const Clock* clock = nullptr)
      : spec(Spec(e, kind)),
        info(spec, *ResolveOptimizer(spec.optimizer(), "o"), 8),
        table(&info, clock) {}
  static v1::TableSpec Spec(const v1::EmbeddingSpec& e, v1::OptimizerSpec::Kind kind) {
    v1::TableSpec s = SparseSpec("emb", kWidth, 0, Optimizer(kind, 0.5f));
    *s.mutable_embedding() = e;
    return s;
  }
  std::vector<float> Read(uint64_t key) {
    std::vector<float> out(kWidth);
    const uint64_t keys[] = {key};
    table.Read(keys, v1::DT_FLOAT32, reinterpret_cast<char*>(out.data()));
    return out;
  }
  std::vector<float> Initial(uint64_t key) const {
    std::vector<float> out(kWidth);
    info.init.FillRow(key, kWidth, out.data());
    return out;
  }
  // Pushes gradient 1 to `keys` at `step`; returns the decisions made.
  std::string Push(std::vector<uint64_t> keys, int64_t step = 0, std::string follow = "") {
    SparseTable::Decisions d;
    d.follow = follow;
    absl::Status s = table.Apply(
        keys, [](size_t, size_t k, float* out) { std::fill(out, out + k, 1.f); }, &budget, step,
        &d);
    EXPECT_TRUE(s.ok()) << s;
    return d.made;
  }
  std::map<uint64_t, std::pair<int64_t, std::vector<float>>> Rows() {
    std::map<uint64_t, std::pair<int64_t, std::vector<float>>> out;
    const size_t n = kWidth * info.floats_per_elem();
    table.ForEachRowSorted([&](uint64_t k, int64_t u, const float* row) {
      out[k] = {u, std::vector<float>(row, row + n)};
    });
    return out;
  }
  v1::TableSpec spec;
  TableInfo info;
  MemoryBudget budget{0};
  SparseTable table;
};

std::vector<float> Minus(std::vector<float> v, float d) {
  for (float& x : v) x -= d;
  return v;
}

TEST(SparseReadTest, PullsOfFreshKeysReadTheInitializerAndCreateNothing) {
  Fixture f{v1::EmbeddingSpec()};
  for (uint64_t k = 0; k < 100; ++k) EXPECT_EQ(f.Read(k * 7919), f.Initial(k * 7919));
  EXPECT_EQ(f.table.rows(), 0u);
  EXPECT_EQ(f.budget.used(), 0u);
  EXPECT_EQ(f.table.policy_counts().reads_without_row, 100u);
  // A later push starts from the same initial values: SGD lr 0.5, g = 1.
  f.Push({7919});
  EXPECT_EQ(f.table.rows(), 1u);
  EXPECT_EQ(f.Read(7919), Minus(f.Initial(7919), 0.5f));
}

TEST(SparseReadTest, AReadOfARepeatedKeyReturnsTheSameRowTwice) {
  Fixture f{v1::EmbeddingSpec()};
  f.Push({5});
  const uint64_t keys[] = {5, 9, 5};
  std::vector<float> out(3 * kWidth);
  f.table.Read(keys, v1::DT_FLOAT32, reinterpret_cast<char*>(out.data()));
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + kWidth), Minus(f.Initial(5), 0.5f));
  EXPECT_EQ(std::vector<float>(out.begin() + kWidth, out.begin() + 2 * kWidth), f.Initial(9));
  EXPECT_EQ(std::vector<float>(out.begin() + 2 * kWidth, out.end()), Minus(f.Initial(5), 0.5f));
}

TEST(AdmissionTest, CountFilterAppliesOnlyFromTheNthPush) {
  v1::EmbeddingSpec e;
  e.set_admit_after_pushes(3);
  e.set_admit_sketch_bytes(4096);
  Fixture f{e};
  EXPECT_EQ(f.Push({11, 12}), std::string(2, kRowCounted));
  EXPECT_EQ(f.table.rows(), 0u);
  EXPECT_EQ(f.Read(11), f.Initial(11)) << "pulls read the initializer until admitted";
  EXPECT_EQ(f.Push({11}), std::string(1, kRowCounted));
  EXPECT_EQ(f.Push({11}), std::string(1, kRowApplied)) << "the third push makes the row";
  EXPECT_EQ(f.table.rows(), 1u);
  EXPECT_EQ(f.Read(11), Minus(f.Initial(11), 0.5f)) << "only the admitting push was applied";
  EXPECT_EQ(f.Push({11, 12}), std::string({kRowApplied, kRowCounted}));
  EXPECT_EQ(f.Read(11), Minus(Minus(f.Initial(11), 0.5f), 0.5f));
  const auto c = f.table.policy_counts();
  EXPECT_EQ(c.admissions, 1u);
  EXPECT_EQ(c.not_admitted, 4u);
  EXPECT_EQ(c.sketch_bytes, 4096u);
}

TEST(AdmissionTest, CountMinSketchNeverUndercountsAndStaysInItsMemory) {
  CountMinSketch sketch(1024);  // 64 counters in each of 4 rows: many collisions.
  EXPECT_EQ(sketch.bytes(), 1024u);
  std::map<uint64_t, uint32_t> truth;
  for (uint64_t i = 0; i < 5000; ++i) {
    const uint64_t key = (i * i) % 701;
    ++truth[key];
    EXPECT_GE(sketch.Add(key), truth[key]);
  }
  for (const auto& [k, n] : truth) EXPECT_GE(sketch.Estimate(k), n);
}

TEST(AdmissionTest, ProbabilityFilterIsDeterministicPerKeyAndStep) {
  v1::EmbeddingSpec e;
  e.set_admit_probability(0.25f);
  Fixture a{e}, b{e};
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 20000; ++k) keys.push_back(k * 104729);
  const std::string da = a.Push(keys, 3);
  EXPECT_EQ(b.Push(keys, 3), da) << "the same seed, table, keys and step draw the same";
  const double admitted = static_cast<double>(a.table.rows()) / keys.size();
  EXPECT_NEAR(admitted, 0.25, 0.02);
  // Another step draws again for the keys still without a row; admitted rows stay.
  a.Push(keys, 4);
  EXPECT_NEAR(static_cast<double>(a.table.rows()) / keys.size(), 1 - 0.75 * 0.75, 0.02);
}

// A copy that follows its primary's decisions ends bit-identical even when its own sketch (here
// far smaller, so it would admit keys early) would have decided otherwise.
TEST(AdmissionTest, ACopyFollowingThePrimarysDecisionsIsBitIdentical) {
  v1::EmbeddingSpec e;
  e.set_admit_after_pushes(4);
  e.set_expire_after_steps(3);
  v1::EmbeddingSpec small = e;
  small.set_admit_sketch_bytes(1024);
  Fixture primary{e, v1::OptimizerSpec::ADAGRAD}, copy{small, v1::OptimizerSpec::ADAGRAD};
  uint64_t x = 1;
  for (int64_t step = 0; step < 40; ++step) {
    std::vector<uint64_t> keys;
    std::map<uint64_t, bool> seen;
    for (int i = 0; i < 300; ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const uint64_t key = (x >> 33) % (step < 20 ? 500 : 3000);
      if (!seen[key]) keys.push_back(key), seen[key] = true;
    }
    const std::string d = primary.Push(keys, step);
    ASSERT_EQ(d.size(), keys.size());
    copy.Push(keys, step, d);
  }
  EXPECT_GT(primary.table.policy_counts().not_admitted, 0u);
  EXPECT_GT(primary.table.policy_counts().expiries, 0u);
  const auto rows = primary.Rows();
  ASSERT_EQ(copy.Rows().size(), rows.size());
  for (const auto& [k, r] : copy.Rows()) {
    ASSERT_TRUE(rows.count(k)) << k;
    EXPECT_EQ(r.first, rows.at(k).first) << k;
    EXPECT_EQ(std::memcmp(r.second.data(), rows.at(k).second.data(), r.second.size() * 4), 0)
        << "row " << k;
  }
}

TEST(AdmissionTest, DecisionsThatDoNotMatchTheKeysAreRefused) {
  v1::EmbeddingSpec e;
  e.set_admit_after_pushes(2);
  Fixture f{e};
  SparseTable::Decisions d;
  d.follow = std::string(1, kRowApplied);
  const uint64_t keys[] = {1, 2};
  absl::Status s = f.table.Apply(
      keys, [](size_t, size_t k, float* out) { std::fill(out, out + k, 1.f); }, &f.budget, 0, &d);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row_decisions: 1 decisions for 2 distinct keys"), std::string::npos)
      << s;
  d.follow = std::string({kRowApplied, 7});
  EXPECT_EQ(f.table.Apply(keys, [](size_t, size_t k, float* out) { std::fill(out, out + k, 1.f); },
                          &f.budget, 0, &d)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.table.rows(), 0u);
}

TEST(ExpiryTest, ARowNotPushedForTStepsRestartsFromTheInitializer) {
  v1::EmbeddingSpec e;
  e.set_expire_after_steps(2);
  Fixture f{e};
  f.Push({5}, 0);
  EXPECT_EQ(f.Push({5}, 2), std::string(1, kRowApplied)) << "2 steps later: still live";
  EXPECT_EQ(f.Read(5), Minus(Minus(f.Initial(5), 0.5f), 0.5f));
  EXPECT_EQ(f.Push({6}, 5), std::string(1, kRowApplied));
  EXPECT_EQ(f.Read(5), f.Initial(5)) << "a pull after step 5 sees an expired row as absent";
  EXPECT_EQ(f.Push({5}, 5), std::string(1, kRowRestarted));
  EXPECT_EQ(f.Read(5), Minus(f.Initial(5), 0.5f)) << "restarted, then one push";
  EXPECT_EQ(f.table.policy_counts().expiries, 1u);
  // Collection frees rows expired for every push from the slowest clock on.
  EXPECT_EQ(f.table.CollectExpired(7, &f.budget), 0u);
  EXPECT_EQ(f.table.CollectExpired(8, &f.budget), 2u);
  EXPECT_EQ(f.table.rows(), 0u);
  EXPECT_EQ(f.budget.used(), 0u);
  EXPECT_EQ(f.table.policy_counts().expiries, 3u);
}

TEST(ExpiryTest, ARowNotPushedForTSecondsRestartsAndIsFreedLater) {
  v1::EmbeddingSpec e;
  e.set_expire_after_seconds(10);
  FakeClock clock;
  Fixture f{e, v1::OptimizerSpec::SGD, &clock};
  f.Push({5});
  clock.Advance(absl::Seconds(10));
  EXPECT_EQ(f.Push({5}), std::string(1, kRowApplied));
  clock.Advance(absl::Seconds(11));
  EXPECT_EQ(f.Read(5), f.Initial(5));
  EXPECT_EQ(f.Push({5}), std::string(1, kRowRestarted));
  EXPECT_EQ(f.Read(5), Minus(f.Initial(5), 0.5f));
  // Freed after twice the expiry plus a minute (a copy's stamps lag its primary's).
  clock.Advance(absl::Seconds(80));
  EXPECT_EQ(f.table.CollectExpired(0, &f.budget), 0u);
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(f.table.CollectExpired(0, &f.budget), 1u);
  EXPECT_EQ(f.table.rows(), 0u);
}

TEST(EmbeddingValidationTest, RefusalsNameTheMember) {
  auto check = [](v1::EmbeddingSpec e, v1::TableKind kind, const std::string& want) {
    absl::Status s = ValidateEmbedding(e, kind, "tables[0].embedding");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_NE(s.message().find(want), std::string::npos) << s;
  };
  v1::EmbeddingSpec e;
  e.set_expire_after_steps(3);
  check(e, v1::DENSE, "tables[0].embedding: admission and expiry apply to sparse");
  e.set_admit_after_pushes(2);
  e.set_admit_probability(0.5f);
  check(e, v1::SPARSE, "admit_probability: cannot be combined with admit_after_pushes");
  e.clear_admit_after_pushes();
  e.set_admit_probability(1.5f);
  check(e, v1::SPARSE, "admit_probability: must be in (0, 1]");
  e.set_admit_probability(0.f);
  e.set_admit_sketch_bytes(1 << 20);
  check(e, v1::SPARSE, "admit_sketch_bytes: applies only with admit_after_pushes >= 2");
  e.set_admit_after_pushes(2);
  e.set_admit_sketch_bytes(100);
  check(e, v1::SPARSE, "admit_sketch_bytes: must be in [1024");
  e.set_admit_sketch_bytes(0);
  EXPECT_TRUE(ValidateEmbedding(e, v1::SPARSE, "x").ok());
  EXPECT_TRUE(ValidateEmbedding(v1::EmbeddingSpec(), v1::DENSE, "x").ok());
}

}  // namespace
}  // namespace pscluster
