// A job's snapshot of some of its shards (the seed of a live copy at a map change): dense blocks
// and sparse rows of those shards only, and a copy restored from it holds exactly those rows.
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "common/checkpoint_file.h"
#include "common/clock.h"
#include "common/sharding.h"
#include "gtest/gtest.h"
#include "server/job.h"
#include "server/testing/test_tables.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

constexpr uint32_t kShards = 8;
constexpr uint32_t kWidth = 4;

std::unique_ptr<Job> NewJob(MemoryBudget* budget, const Clock* clock,
                            const std::string& spill_dir = "") {
  JobConfig config;
  config.job_id = "j";
  config.spill_dir = spill_dir;
  config.consistency.set_mode(v1::ConsistencySpec::ASP);
  config.num_workers = 1;
  config.num_shards = kShards;
  auto job = std::make_unique<Job>(config, budget, clock, DataPlaneLimits{});
  const auto sgd = Optimizer(v1::OptimizerSpec::SGD, 0.5f);
  std::vector<v1::TableSpec> specs = {SparseSpec("emb", kWidth, 0, sgd),
                                      DenseSpec("w", {1000}, sgd, 100)};
  std::vector<OptimizerParams> opts;
  for (const auto& s : specs) opts.push_back(*ResolveOptimizer(s.optimizer(), "optimizer"));
  EXPECT_TRUE(job->AddTables(specs, opts).ok());
  EXPECT_TRUE(job->SetShards(1, std::vector<bool>(kShards, true)).ok());
  return job;
}

std::vector<uint64_t> Keys() {
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 400; ++k) keys.push_back(k * 7919 + 3);
  return keys;
}

absl::Status PushAll(Job& job, const std::vector<uint64_t>& keys, int64_t step = 0) {
  v1::PushChunk c;
  c.mutable_tag()->set_job_id("j");
  c.mutable_tag()->set_worker(0);
  c.mutable_tag()->set_step(step);
  c.set_epoch(1);
  c.mutable_slice()->set_table("emb");
  c.mutable_slice()->set_keys(std::string(reinterpret_cast<const char*>(keys.data()),
                                          keys.size() * 8));
  c.set_end_of_step(true);
  std::vector<float> g(keys.size() * kWidth);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
  return job
      .Push(c, Payload::FromString(
                   std::string(reinterpret_cast<const char*>(g.data()), g.size() * 4)))
      .status();
}

// All the bytes of a snapshot, wherever they are.
std::string BytesOf(const CheckpointSnapshot& snap) {
  std::string scratch;
  auto all = SourceOf(snap)->Read(0, snap.size, &scratch);
  EXPECT_TRUE(all.ok()) << all.status();
  return all.ok() ? std::string(*all) : "";
}

// The seed of shards 2 and 5, taken as map 2 takes effect.
CheckpointSnapshot SeedOf(Job& job) {
  std::vector<bool> seed_shards(kShards, false);
  seed_shards[2] = seed_shards[5] = true;
  CheckpointSnapshot seed;
  Job::MapChange change;
  change.seed = [&](CheckpointSnapshot s) { seed = std::move(s); };
  change.seed_shards = seed_shards;
  EXPECT_TRUE(job.SetShards(2, std::vector<bool>(kShards, true), std::move(change)).ok());
  return seed;
}

uint64_t RowsOf(Job& job, bool on_disk = false) {
  v1::JobOnServer status;
  job.FillStatus(&status);
  for (const auto& t : status.tables()) {
    if (t.name() == "emb") return on_disk ? t.rows_on_disk() : t.rows();
  }
  return 0;
}

// A job whose sparse table has a disk tier (most of its rows on disk) seeds a copy, and hands a
// copy over, through an anonymous spool file, not memory: the same bytes as the snapshot of the
// same rows held in memory, read back a piece at a time.
TEST(JobSnapshotTest, ACopyOfATieredJobIsSpooledAndHoldsTheSameBytes) {
  FakeClock clock;
  const std::vector<uint64_t> keys = Keys();
  MemoryBudget small{8 << 10};
  auto tiered = NewJob(&small, &clock, ::testing::TempDir());
  MemoryBudget unlimited{0};
  auto in_memory = NewJob(&unlimited, &clock);
  for (size_t first = 0; first < keys.size(); first += 40) {  // 40 new rows a step.
    const std::vector<uint64_t> part(keys.begin() + first, keys.begin() + first + 40);
    const int64_t step = static_cast<int64_t>(first / 40);
    absl::Status s = PushAll(*tiered, part, step);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(PushAll(*in_memory, part, step).ok());
  }
  ASSERT_GT(RowsOf(*tiered, /*on_disk=*/true), keys.size() / 4) << "many rows are on disk";
  EXPECT_EQ(tiered->SpoolDir(), ::testing::TempDir());
  EXPECT_EQ(in_memory->SpoolDir(), "");

  const CheckpointSnapshot spooled = SeedOf(*tiered);
  const CheckpointSnapshot held = SeedOf(*in_memory);
  ASSERT_NE(spooled.spool, nullptr);
  EXPECT_TRUE(spooled.bytes.empty());
  EXPECT_EQ(held.spool, nullptr);
  EXPECT_EQ(spooled.size, held.size);
  EXPECT_EQ(spooled.crc, held.crc);
  EXPECT_TRUE(BytesOf(spooled) == held.bytes) << "the seed of shards 2 and 5, byte for byte";
  std::string scratch;
  EXPECT_EQ(SourceOf(spooled)->Read(spooled.size - 4, 5, &scratch).status().code(),
            absl::StatusCode::kDataLoss);

  // The whole job, for another copy (a takeover): spooled too, and loads into a copy.
  auto whole = tiered->SnapshotForCopy("s0", 0, /*seal=*/true);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_NE(whole->spool, nullptr);
  auto whole_held = in_memory->SnapshotForCopy("s0", 0, /*seal=*/false);
  ASSERT_TRUE(whole_held.ok());
  EXPECT_TRUE(BytesOf(*whole) == whole_held->bytes);
  EXPECT_EQ(PushAll(*tiered, keys, 10).code(), absl::StatusCode::kFailedPrecondition)
      << "a sealed copy takes no more updates";
  MemoryBudget copy_budget{8 << 10};
  auto copy = NewJob(&copy_budget, &clock, ::testing::TempDir());
  ASSERT_TRUE(copy->Restore(*SourceOf(*whole), "copy").ok());
  EXPECT_EQ(RowsOf(*copy), keys.size());
}

TEST(JobSnapshotTest, ASeedOfSomeShardsHoldsOnlyTheirBlocksAndRows) {
  RealClock clock;
  MemoryBudget budget{0};
  auto job = NewJob(&budget, &clock);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 400; ++k) keys.push_back(k * 7919 + 3);
  v1::PushChunk c;
  c.mutable_tag()->set_job_id("j");
  c.mutable_tag()->set_worker(0);
  c.mutable_tag()->set_step(0);
  c.set_epoch(1);
  c.mutable_slice()->set_table("emb");
  c.mutable_slice()->set_keys(std::string(reinterpret_cast<const char*>(keys.data()),
                                          keys.size() * 8));
  c.set_end_of_step(true);
  std::vector<float> g(keys.size() * kWidth, 1.0f);
  ASSERT_TRUE(
      job->Push(c, Payload::FromString(std::string(reinterpret_cast<const char*>(g.data()),
                                                   g.size() * 4)))
          .ok());

  std::vector<bool> seed_shards(kShards, false);
  seed_shards[2] = seed_shards[5] = true;
  std::string seed;
  Job::MapChange change;
  change.seed = [&](CheckpointSnapshot s) { seed = s.bytes; };
  change.seed_shards = seed_shards;
  ASSERT_TRUE(job->SetShards(2, std::vector<bool>(kShards, true), std::move(change)).ok());
  auto parsed = ParseCheckpoint(seed, "seed");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::CheckpointHeader& h = parsed->header;
  EXPECT_EQ(std::set<uint32_t>(h.shards().begin(), h.shards().end()),
            (std::set<uint32_t>{2, 5}));

  const uint64_t emb = TableHash("emb"), w = TableHash("w");
  std::set<uint64_t> expected;
  for (uint64_t k : keys) {
    if (seed_shards[ShardOfKey(emb, k, kShards)]) expected.insert(k);
  }
  ASSERT_GT(expected.size(), 0u);
  ASSERT_LT(expected.size(), keys.size());
  ASSERT_EQ(h.tables_size(), 2);
  const v1::CheckpointTable& rows = h.tables(0);
  ASSERT_EQ(rows.rows(), expected.size()) << "only the rows of shards 2 and 5";
  std::set<uint64_t> got;
  for (uint64_t r = 0; r < rows.rows(); ++r) {
    uint64_t k;
    std::memcpy(&k, parsed->data.data() + rows.keys_offset() + 8 * r, 8);
    got.insert(k);
  }
  EXPECT_EQ(got, expected);
  for (const auto& b : h.tables(1).blocks()) {
    EXPECT_TRUE(seed_shards[ShardOfBlock(w, b.block(), kShards)]) << "block " << b.block();
  }

  // A copy holding those shards, restored from the seed, has exactly those rows, as pushed.
  MemoryBudget copy_budget{0};
  auto copy = NewJob(&copy_budget, &clock);
  ASSERT_TRUE(copy->SetShards(2, seed_shards).ok());
  ASSERT_TRUE(copy->Restore(seed, "seed").ok());
  v1::JobOnServer status;
  copy->FillStatus(&status);
  ASSERT_GE(status.tables_size(), 1);
  uint64_t copy_rows = 0;
  for (const auto& t : status.tables()) {
    if (t.name() == "emb") copy_rows = t.rows();
  }
  EXPECT_EQ(copy_rows, expected.size());
}

}  // namespace
}  // namespace pscluster
