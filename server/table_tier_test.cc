// The disk tier of sparse tables: rows spilled under a memory cap come back bit-identical to an
// uncapped table's, checkpoints (ForEachRowSorted / PutRow) cover both tiers, and bad input is
// refused naming the table, the directory or the limit.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <iostream>
#include <algorithm>
#include <atomic>
#include <map>
#include <thread>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_set.h"
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
  EXPECT_GT(c.updated_on_disk, 0u) << "rows pushed once while on disk were updated there";
  EXPECT_EQ(capped.table.bytes_held(), capped.budget.used());
  ExpectSameRows(ram.All(), capped.All(), /*steps=*/GetParam());
  EXPECT_TRUE(Exists(dir));
  capped.table.Clear(&capped.budget);
  EXPECT_FALSE(Exists(dir)) << "the disk tier goes with the table";
  EXPECT_EQ(capped.table.rows(), 0u);
}

INSTANTIATE_TEST_SUITE_P(PlainAndWithPolicy, TierTest, ::testing::Bool());

// A row pushed while on disk is updated where it lies until it has been pushed lately more often
// than the rows spilled lately (here rows restored from a checkpoint, never pushed: its first push
// leaves it on disk, its second brings it back); either way its values are an uncapped table's.
TEST(TierAdmissionTest, ARowPushedOnDiskStaysThereUntilPushedMoreOftenThanTheRowsSpilled) {
  const uint64_t row_bytes = kWidth * 2 * sizeof(float);
  Table ram(v1::EmbeddingSpec(), 0, ""),
      capped(v1::EmbeddingSpec(), 10 * row_bytes, TempDir() + "/tier_admission");
  std::vector<float> row(kWidth * 2);
  for (uint64_t k = 0; k < 30; ++k) {
    for (size_t j = 0; j < row.size(); ++j) row[j] = 0.5f + 0.01f * static_cast<float>(k + j);
    ASSERT_TRUE(ram.table.PutRow(k, 1, row.data(), &ram.budget, 0).ok());
    absl::Status s = capped.table.PutRow(k, 1, row.data(), &capped.budget, 0);
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_GE(capped.table.policy_counts().rows_on_disk, 20u);
  auto push = [&](const std::vector<uint64_t>& keys, int64_t step) {
    ASSERT_TRUE(ram.Push(keys, step).ok());
    absl::Status st = capped.Push(keys, step);
    ASSERT_TRUE(st.ok()) << st;
  };
  // The first key found on disk by a push of its own: updated there, nothing spilled for it.
  uint64_t key = 30;
  for (uint64_t k = 0; k < 30 && key == 30; ++k) {
    const auto before = capped.table.policy_counts();
    push({k}, 1);
    const auto after = capped.table.policy_counts();
    if (after.updated_on_disk == before.updated_on_disk + 1) {
      key = k;
      EXPECT_EQ(after.rows_on_disk, before.rows_on_disk);
      EXPECT_EQ(after.spills, before.spills);
      EXPECT_EQ(after.disk_reads, before.disk_reads + 1);
    }
  }
  ASSERT_LT(key, 30u) << "no push found its row on disk";
  // Its second push brings it back: the rows spilled so far were never pushed.
  const auto before = capped.table.policy_counts();
  push({key}, 2);
  const auto after = capped.table.policy_counts();
  EXPECT_EQ(after.updated_on_disk, before.updated_on_disk);
  EXPECT_LT(after.rows_on_disk, before.rows_on_disk);
  (void)capped.Read({key});
  EXPECT_EQ(capped.table.policy_counts().ram_hits, after.ram_hits + 1);
  EXPECT_LE(capped.budget.used(), 10 * row_bytes);
  ExpectSameRows(ram.All(), capped.All(), /*steps=*/false);  // Only a tier records steps.
}

// Rows made by one push each, a long tail, do not push out rows pushed often: spilling takes, of
// the rows the clock offers, those pushed least often. The hot rows are untouched for nine steps
// at a time, long enough for the clock to pass them several times: a plain clock spills most of
// them in between (measured: 6,835 of the 10,000 hot reads then missed memory; here none).
TEST(TierAdmissionTest, HotRowsStayInMemoryWhileATailOfOneOffRowsPassesThrough) {
  const uint64_t row_bytes = kWidth * 2 * sizeof(float);
  Table ram(v1::EmbeddingSpec(), 0, ""),
      capped(v1::EmbeddingSpec(), 2000 * row_bytes, TempDir() + "/tier_tail");
  auto push = [&](const std::vector<uint64_t>& keys, int64_t step) {
    ASSERT_TRUE(ram.Push(keys, step).ok());
    absl::Status st = capped.Push(keys, step);
    ASSERT_TRUE(st.ok()) << st;
  };
  std::vector<uint64_t> hot(500);
  for (uint64_t k = 0; k < hot.size(); ++k) hot[k] = k;
  for (int step = 0; step < 8; ++step) push(hot, step);
  uint64_t next = 1000000, hot_reads = 0, hot_misses = 0;
  for (int step = 8; step < 208; ++step) {
    if (step % 10 == 0) {
      const auto before = capped.table.policy_counts();
      EXPECT_EQ(capped.Read(hot), ram.Read(hot));
      const auto after = capped.table.policy_counts();
      hot_reads += hot.size();
      hot_misses += after.disk_reads - before.disk_reads;
      push(hot, step);
    } else {
      std::vector<uint64_t> tail(250);
      for (uint64_t& k : tail) k = next++;
      push(tail, step);
    }
  }
  EXPECT_GT(capped.table.policy_counts().spills, 40000u);
  std::cout << "hot rows read from disk: " << hot_misses << " of " << hot_reads << "\n";
  EXPECT_LT(hot_misses, hot_reads / 20) << hot_misses << " of " << hot_reads;
  EXPECT_LE(capped.budget.used(), 2000 * row_bytes);
  ExpectSameRows(ram.All(), capped.All(), /*steps=*/false);
}

// Pulls and pushes of many keys share their disk reads out among threads, stripe by stripe
// (SparseTable::RunShared), and a push takes the rows its pull just read from disk instead of
// reading them again: the rows are still an uncapped table's, bit for bit.
TEST(TierSharedReadsTest, LargeCallsReadTheDiskFromSeveralThreadsAndMatchAnUncappedTable) {
  const uint64_t row_bytes = kWidth * 2 * sizeof(float);
  Table ram(v1::EmbeddingSpec(), 0, ""),
      capped(v1::EmbeddingSpec(), 3000 * row_bytes, TempDir() + "/tier_shared");
  uint64_t x = 0x2545f4914f6cdd1dULL;
  for (int step = 0; step < 40; ++step) {
    // 2,000 distinct keys of 20,000, skewed towards the low ones.
    std::vector<uint64_t> keys;
    absl::flat_hash_set<uint64_t> seen;
    while (keys.size() < 2000) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const double u = static_cast<double>(x % 1000003) / 1000003.0;
      const uint64_t k = static_cast<uint64_t>(20000 * u * u * u);
      if (seen.insert(k).second) keys.push_back(k);
    }
    ASSERT_EQ(ram.Read(keys), capped.Read(keys)) << "step " << step;
    ASSERT_TRUE(ram.Push(keys, step).ok());
    absl::Status s = capped.Push(keys, step);
    ASSERT_TRUE(s.ok()) << s;
  }
  if (std::thread::hardware_concurrency() > 1) {
    EXPECT_GT(capped.table.shared_calls(), 40u) << "pulls and pushes that read from disk";
  }
  EXPECT_GT(capped.table.policy_counts().disk_reads, 0u);
  // Each push follows a pull of its keys: the rows that pull read from disk are not read again.
  EXPECT_GT(capped.table.read_back_hits(), 1000u);
  ExpectSameRows(ram.All(), capped.All(), /*steps=*/false);
}

// Pushes from several workers at once (a job's pushes run concurrently) of the same rows, most of
// them on disk: every push reaches every row exactly once, whether the row is updated where it
// lies, brought back, or spilled again meanwhile by another push. A push that read a row from
// disk in its first phase must not apply to that copy once another push has written the row
// since (a lost update).
TEST(TierConcurrencyTest, ConcurrentPushesOfRowsOnDiskLoseNoUpdate) {
  const uint64_t row_bytes = kWidth * 2 * sizeof(float);
  // Room for three pushes pinning their rows and three taking memory for theirs at once.
  Table capped(v1::EmbeddingSpec(), 1000 * row_bytes, TempDir() + "/tier_concurrent");
  constexpr int kThreads = 3, kRounds = 40;
  constexpr uint64_t kKeys = 3000;
  std::vector<uint64_t> keys(kKeys);
  for (uint64_t k = 0; k < kKeys; ++k) keys[k] = k * 7919;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint64_t> mine = keys;
      uint64_t x = 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(t + 1);
      for (int round = 0; round < kRounds; ++round) {
        // Each thread pushes the keys in its own order, 100 at a time.
        for (size_t i = mine.size() - 1; i > 0; --i) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          std::swap(mine[i], mine[x % (i + 1)]);
        }
        for (uint64_t first = 0; first < kKeys; first += 100) {
          std::vector<uint64_t> part(mine.begin() + first, mine.begin() + first + 100);
          absl::Status s = capped.table.Apply(
              part, [](size_t, size_t k, float* out) { std::fill(out, out + k, 0.25f); },
              &capped.budget, round);
          if (!s.ok()) {
            ADD_FAILURE() << s;
            ++failures;
            return;
          }
        }
      }
    });
  }
  // And pulls of every key meanwhile (their disk reads shared out among threads).
  std::atomic<int> pushers_done{0};
  std::thread reader([&] {
    while (pushers_done.load() == 0) (void)capped.Read(keys);
  });
  for (auto& th : threads) th.join();
  pushers_done = 1;
  reader.join();
  ASSERT_EQ(failures.load(), 0);
  const auto c = capped.table.policy_counts();
  EXPECT_GT(c.updated_on_disk, 0u) << "no row was updated where it lies";
  EXPECT_GT(c.disk_reads, 0u);
  const Rows all = capped.All();
  ASSERT_EQ(all.size(), kKeys);
  int lost = 0;
  for (const auto& [k, r] : all) {
    if (std::get<0>(r) != kThreads * kRounds) ++lost;
  }
  EXPECT_EQ(lost, 0) << "rows with fewer (or more) than " << kThreads * kRounds << " updates";
  // Adagrad with one gradient value: a row after n updates does not depend on their order, so
  // every row equals an uncapped table's pushed as often.
  Table ram(v1::EmbeddingSpec(), 0, "");
  auto quarter = [](size_t, size_t k, float* out) { std::fill(out, out + k, 0.25f); };
  for (int i = 0; i < kThreads * kRounds; ++i) {
    ASSERT_TRUE(ram.table.Apply(keys, quarter, &ram.budget, 0).ok());
  }
  ExpectSameRows(ram.All(), all, /*steps=*/false);
}

// Expired rows on disk are freed by collection too, a slice of the disk tier (in key order) per
// call, so that a call never passes over a whole disk tier; what remains equals an uncapped
// table's.
TEST(TierExpiryTest, ExpiredRowsOnDiskAreFreedASliceAtATime) {
  v1::EmbeddingSpec e;
  e.set_expire_after_steps(2);
  const uint64_t row_bytes = kWidth * 2 * sizeof(float);
  Table ram(e, 0, ""), capped(e, 1000 * row_bytes, TempDir() + "/tier_expiry");
  const uint64_t n = SparseTable::kDiskSweepRows + 4000;
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < n; ++k) {
    keys.push_back(k * 7919 + 3);
    if (keys.size() == 500 || k + 1 == n) {
      ASSERT_TRUE(ram.Push(keys, 0).ok());
      absl::Status st = capped.Push(keys, 0);
      ASSERT_TRUE(st.ok()) << st;
      keys.clear();
    }
  }
  const std::vector<uint64_t> fresh = {1, 2, 4, 8, 16};
  ASSERT_TRUE(ram.Push(fresh, 10).ok());
  ASSERT_TRUE(capped.Push(fresh, 10).ok());
  const uint64_t on_disk = capped.table.policy_counts().rows_on_disk;
  ASSERT_GT(on_disk, SparseTable::kDiskSweepRows);
  EXPECT_EQ(ram.table.CollectExpired(12, &ram.budget), n);
  // The first call frees the expired rows in memory and one slice on disk; the next, the rest.
  const uint64_t first = capped.table.CollectExpired(12, &capped.budget);
  EXPECT_EQ(capped.table.policy_counts().rows_on_disk, on_disk - SparseTable::kDiskSweepRows);
  EXPECT_EQ(first, n - on_disk + SparseTable::kDiskSweepRows);
  EXPECT_EQ(capped.table.CollectExpired(12, &capped.budget), on_disk - SparseTable::kDiskSweepRows);
  EXPECT_EQ(capped.table.policy_counts().rows_on_disk, 0u);
  EXPECT_EQ(capped.table.CollectExpired(12, &capped.budget), 0u);
  EXPECT_EQ(capped.table.rows(), fresh.size());
  EXPECT_EQ(capped.table.policy_counts().expiries, n);
  ExpectSameRows(ram.All(), capped.All(), /*steps=*/true);
  // A freed key starts again from the initializer, as in the uncapped table.
  ASSERT_TRUE(ram.Push({3}, 13).ok());
  ASSERT_TRUE(capped.Push({3}, 13).ok());
  EXPECT_EQ(ram.Read({3}), capped.Read({3}));
}

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

// A restore writes the rows that do not fit in memory straight to the disk tier as whole files
// (DiskLoad): they read back as saved, with their step counts and the steps of their last pushes
// (expiry), and count as rows on disk once added.
TEST(TierCheckpointTest, RowsRestoredStraightToDiskAreTheSavedOnes) {
  const uint64_t row_bytes = kWidth * 2 * sizeof(float);
  v1::EmbeddingSpec e;
  e.set_expire_after_steps(1000);
  Table capped(e, 50 * row_bytes, TempDir() + "/tier_direct_a");
  for (int step = 0; step < 300; ++step) ASSERT_TRUE(capped.Push(StepKeys(step), step).ok());
  const Rows before = capped.All();
  Table restored(e, 50 * row_bytes, TempDir() + "/tier_direct_b");
  auto load = restored.table.StartDiskLoad();
  ASSERT_TRUE(load.ok()) << load.status();
  size_t in_memory = 0, to_disk = 0;
  for (const auto& [k, r] : before) {
    if (in_memory < 40) {
      ASSERT_TRUE(restored.table.PutRow(k, std::get<0>(r), std::get<2>(r).data(),
                                        &restored.budget, std::get<1>(r))
                      .ok());
      ++in_memory;
    } else {
      absl::Status s = (*load)->Add(k, std::get<0>(r), std::get<1>(r), std::get<2>(r).data());
      ASSERT_TRUE(s.ok()) << s;
      ++to_disk;
    }
  }
  ASSERT_GT(to_disk, 0u);
  EXPECT_EQ(restored.table.policy_counts().rows_on_disk, 0u) << "counted once in the store";
  absl::Status s = (*load)->Finish();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(restored.table.policy_counts().rows_on_disk, to_disk);
  EXPECT_EQ(restored.table.rows(), before.size());
  ExpectSameRows(before, restored.All());
  std::vector<uint64_t> all(500);
  for (uint64_t k = 0; k < all.size(); ++k) all[k] = k;
  EXPECT_EQ(capped.Read(all), restored.Read(all));

  Table in_ram(e, 0, "");
  EXPECT_EQ(in_ram.table.StartDiskLoad().status().code(), absl::StatusCode::kFailedPrecondition);
}

// Rows loaded in any order, a key twice among them: each key not above the one before starts
// another file, the later row of a key wins, and no file is left behind in the directory.
TEST(TierCheckpointTest, RowsLoadedOutOfOrderAreRightAndLeaveNoFileBehind) {
  const uint64_t row_bytes = kWidth * 2 * sizeof(float);
  const std::string dir = TempDir() + "/tier_load_order";
  Table ram(v1::EmbeddingSpec(), 0, ""), capped(v1::EmbeddingSpec(), 10 * row_bytes, dir);
  std::vector<uint64_t> keys;
  for (uint64_t run : {2, 0, 1}) {  // Three ascending runs, the later ones below the first.
    for (uint64_t k = 0; k < 1000; ++k) keys.push_back(run * 1000 + k);
  }
  keys.push_back(keys[10]);  // Again, with other values: the later row is the one kept.
  auto load = capped.table.StartDiskLoad();
  ASSERT_TRUE(load.ok()) << load.status();
  std::vector<float> row(kWidth * 2);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t j = 0; j < row.size(); ++j) row[j] = 0.001f * static_cast<float>(i * 8 + j);
    ASSERT_TRUE(ram.table.PutRow(keys[i], static_cast<int64_t>(i), row.data(), &ram.budget).ok());
    absl::Status s = (*load)->Add(keys[i], static_cast<int64_t>(i), 0, row.data());
    ASSERT_TRUE(s.ok()) << s;
  }
  absl::Status s = (*load)->Finish();
  ASSERT_TRUE(s.ok()) << s;
  load->reset();
  EXPECT_EQ(capped.table.policy_counts().rows_on_disk, keys.size());
  ExpectSameRows(ram.All(), capped.All(), /*steps=*/false);
  std::vector<uint64_t> sorted(keys.begin(), keys.end() - 1);
  EXPECT_EQ(ram.Read(sorted), capped.Read(sorted));
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(f.path().filename().string().rfind("bulk-", 0), std::string::npos) << f.path();
  }
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
