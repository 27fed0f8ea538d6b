// The disk tier of sparse tables: rows spilled under a memory cap come back bit-identical to an
// uncapped table's, checkpoints (ForEachRowSorted / PutRow) cover both tiers, and bad input is
// refused naming the table, the directory or the limit.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "server/table.h"
#include "server/testing/test_tables.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

constexpr uint32_t kWidth = 4;

std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

using Rows = std::map<uint64_t, std::tuple<int64_t, int64_t, std::vector<float>>>;

struct Table {
  Table(const v1::EmbeddingSpec& e, uint64_t limit, std::string spill)
      : spec(Spec(e)),
        info(spec, *ResolveOptimizer(spec.optimizer(), "o"), 8),
        budget(limit),
        table(&info, nullptr, std::move(spill)) {}
  static v1::TableSpec Spec(const v1::EmbeddingSpec& e) {
    v1::TableSpec s = SparseSpec("emb", kWidth, 0, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.1f));
    *s.mutable_embedding() = e;
    return s;
  }
  absl::Status Push(const std::vector<uint64_t>& keys, int64_t step) {
    return table.Apply(
        keys,
        [&](size_t first, size_t k, float* out) {
          for (size_t j = 0; j < k; ++j) out[j] = 0.01f * static_cast<float>((first + j + step) % 17) - 0.08f;
        },
        &budget, step);
  }
  std::vector<float> Read(const std::vector<uint64_t>& keys) {
    std::vector<float> out(keys.size() * kWidth);
    table.Read(keys, v1::DT_FLOAT32, reinterpret_cast<char*>(out.data()));
    return out;
  }
  Rows All() {
    Rows out;
    const size_t n = kWidth * info.floats_per_elem();
    table.ForEachRowSortedWithStep([&](uint64_t k, int64_t u, int64_t last, const float* row) {
      EXPECT_EQ(out.count(k), 0u) << "key " << k << " in both tiers";
      out[k] = {u, last, std::vector<float>(row, row + n)};
    });
    return out;
  }
  v1::TableSpec spec;
  TableInfo info;
  MemoryBudget budget;
  SparseTable table;
};

// Keys 0..499 with a skewed frequency (500 u^6): the step's 20 distinct keys.
std::vector<uint64_t> StepKeys(int step) {
  std::vector<uint64_t> keys;
  uint64_t x = 88172645463325252ULL ^ static_cast<uint64_t>(step);
  while (keys.size() < 20) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const double u = static_cast<double>(x % 1000000) / 1e6;
    const uint64_t k = static_cast<uint64_t>(500 * u * u * u * u * u * u);
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  }
  return keys;
}

void ExpectSameRows(const Rows& a, const Rows& b, bool steps = true) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, r] : a) {
    ASSERT_TRUE(b.count(k)) << k;
    const auto& o = b.at(k);
    EXPECT_EQ(std::get<0>(r), std::get<0>(o)) << "updates of " << k;
    if (steps) {
      EXPECT_EQ(std::get<1>(r), std::get<1>(o)) << "last step of " << k;
    }
    EXPECT_EQ(std::memcmp(std::get<2>(r).data(), std::get<2>(o).data(), std::get<2>(r).size() * 4),
              0)
        << "row " << k;
  }
}

class TierTest : public ::testing::TestWithParam<bool> {};

TEST_P(TierTest, ACappedTableIsBitIdenticalToAnUncappedOne) {
  v1::EmbeddingSpec e;
  if (GetParam()) {  // With admission and expiry too.
    e.set_admit_after_pushes(2);
    e.set_expire_after_steps(300);
  }
  const uint64_t row_bytes = kWidth * 2 * sizeof(float);
  const std::string dir = TempDir() + (GetParam() ? "/tier_policy" : "/tier_plain");
  Table ram(e, 0, ""), capped(e, 200 * row_bytes, dir);
  std::vector<uint64_t> all(520);
  for (uint64_t k = 0; k < all.size(); ++k) all[k] = k;
  for (int step = 0; step < 1500; ++step) {
    const auto keys = StepKeys(step);
    ASSERT_TRUE(ram.Push(keys, step).ok());
    absl::Status s = capped.Push(keys, step);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_LE(capped.budget.used(), 200 * row_bytes);
    if (step % 100 == 0) {
      ASSERT_EQ(ram.Read(all), capped.Read(all)) << "step " << step;
    }
  }
  EXPECT_EQ(ram.Read(all), capped.Read(all));
  EXPECT_EQ(ram.table.rows(), capped.table.rows());
  const auto c = capped.table.policy_counts();
  EXPECT_GT(c.spills, 0u);
  EXPECT_GT(c.rows_on_disk, 0u);
  EXPECT_GT(c.disk_reads, 0u);
  EXPECT_GT(c.ram_hits, c.disk_reads) << "skewed traffic mostly hits memory";
  EXPECT_EQ(capped.table.bytes_held(), capped.budget.used());
  ExpectSameRows(ram.All(), capped.All(), /*steps=*/GetParam());
  EXPECT_TRUE(Exists(dir));
  capped.table.Clear(&capped.budget);
  EXPECT_FALSE(Exists(dir)) << "the disk tier goes with the table";
  EXPECT_EQ(capped.table.rows(), 0u);
}

INSTANTIATE_TEST_SUITE_P(PlainAndWithPolicy, TierTest, ::testing::Bool());

// A checkpoint reads both tiers (ForEachRowSorted); restoring it into a capped table spills
// again and gives back the same rows.
TEST(TierCheckpointTest, BothTiersAreWrittenAndRestored) {
  const uint64_t row_bytes = kWidth * 2 * sizeof(float);
  Table capped(v1::EmbeddingSpec(), 50 * row_bytes, TempDir() + "/tier_ckpt_a");
  for (int step = 0; step < 300; ++step) ASSERT_TRUE(capped.Push(StepKeys(step), step).ok());
  const Rows before = capped.All();
  ASSERT_GT(capped.table.policy_counts().rows_on_disk, 0u);
  Table restored(v1::EmbeddingSpec(), 50 * row_bytes, TempDir() + "/tier_ckpt_b");
  for (const auto& [k, r] : before) {
    absl::Status s = restored.table.PutRow(k, std::get<0>(r), std::get<2>(r).data(),
                                           &restored.budget, std::get<1>(r));
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_LE(restored.budget.used(), 50 * row_bytes);
  ExpectSameRows(before, restored.All());
  std::vector<uint64_t> all(500);
  for (uint64_t k = 0; k < all.size(); ++k) all[k] = k;
  EXPECT_EQ(capped.Read(all), restored.Read(all));
}

TEST(TierBadInputTest, APushLargerThanTheCapIsRefusedNamingTableLimitAndDirectory) {
  const uint64_t row_bytes = kWidth * 2 * sizeof(float);
  const std::string dir = TempDir() + "/tier_small";
  Table t(v1::EmbeddingSpec(), 10 * row_bytes, dir);
  std::vector<uint64_t> keys(11);
  for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k;
  absl::Status s = t.Push(keys, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("table 'emb'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--memory_bytes limit 320"), std::string::npos) << s;
  EXPECT_NE(s.message().find(dir), std::string::npos) << s;
  EXPECT_EQ(t.table.rows(), 0u) << "nothing was applied";
  keys.pop_back();
  EXPECT_TRUE(t.Push(keys, 0).ok()) << "ten rows fit";
}

TEST(TierBadInputTest, AMissingDirectoryIsNamed) {
  const std::string dir = TempDir() + "/no/such/dir/tier";
  const uint64_t row_bytes = kWidth * 2 * sizeof(float);
  Table t(v1::EmbeddingSpec(), 4 * row_bytes, dir);
  ASSERT_TRUE(t.Push({1, 2, 3, 4}, 0).ok()) << "no spill needed yet";
  absl::Status s = t.Push({5}, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("table 'emb'"), std::string::npos) << s;
  EXPECT_NE(s.message().find(dir), std::string::npos) << s;
  EXPECT_EQ(t.table.rows(), 4u);
}

}  // namespace
}  // namespace pscluster
