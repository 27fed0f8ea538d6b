// The real ps_server binary with a memory cap and a disk tier (--spill_dir), killed with SIGKILL
// while its pushes spill rows: what comes back is exactly its last checkpoint, both tiers (the
// disk tier is a cache of the process, not a copy to recover from). The next server started on
// the same --spill_dir removes the killed server's databases and leaves a live server's alone.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/testing/tiered_daemon.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

constexpr uint32_t kWidth = 16;
constexpr uint64_t kKeys = 20000;
constexpr size_t kPerStep = 512;
constexpr uint64_t kRowBytes = kWidth * 2 * sizeof(float);  // Adagrad: weights and accumulator.
constexpr int kStepsBeforeCheckpoint = 40;
constexpr uint64_t kCap = 1500 * kRowBytes;

const v1::TableSpec& Emb() {
  static const v1::TableSpec* spec = new v1::TableSpec(
      SparseSpec("emb", kWidth, kKeys, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.05f)));
  return *spec;
}

// The step's kPerStep distinct keys, spread over the whole key space (most rows are cold).
std::vector<uint64_t> StepKeys(int step) {
  std::vector<uint64_t> keys;
  std::set<uint64_t> seen;
  uint64_t x = 0x9e3779b97f4a7c15ULL * (step + 1);
  while (keys.size() < kPerStep) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    if (seen.insert(x % kKeys).second) keys.push_back(x % kKeys);
  }
  return keys;
}

std::vector<uint64_t> AllKeys() {
  std::vector<uint64_t> all(kKeys);
  for (uint64_t k = 0; k < kKeys; ++k) all[k] = k;
  return all;
}

// The databases under `dir` (directories with a RocksDB LOCK file).
std::set<std::string> Databases(const std::string& dir) {
  std::set<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    struct stat st;
    if (name != "." && name != ".." && stat((dir + "/" + name + "/LOCK").c_str(), &st) == 0) {
      out.insert(name);
    }
  }
  closedir(d);
  return out;
}

absl::Status PushStep(PsClient& client, int step) {
  const std::vector<uint64_t> keys = StepKeys(step);
  std::vector<float> g(keys.size() * kWidth);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.001f * static_cast<float>((i + step) % 23) - 0.01f;
  return client.Push(step, {{}, {{"emb", keys, g.data()}}});
}

std::vector<float> PullAll(PsClient& client, int64_t clock) {
  const std::vector<uint64_t> all = AllKeys();
  std::vector<float> rows(kKeys * kWidth);
  absl::Status s = client.Pull(clock, {{}, {{"emb", all, rows.data()}}});
  EXPECT_TRUE(s.ok()) << s;
  return rows;
}

TEST(DiskTierCrashTest, AKillDuringSpillsLosesOnlyWhatTheCheckpointModelAllows) {
  const std::string spill_dir = TempDir("spill");
  ASSERT_EQ(mkdir(spill_dir.c_str(), 0755), 0);
  const std::string ckpt_dir = TempDir("ckpt");

  // Server A trains past its cap, checkpoints, and records what the checkpoint holds.
  TieredServer a = StartTieredServer("a", kCap, spill_dir);
  ASSERT_FALSE(a.address.empty()) << a.daemon->Log();
  std::unique_ptr<PsClient> ca = JobClient(a, Emb());
  ASSERT_NE(ca, nullptr);
  for (int step = 0; step < kStepsBeforeCheckpoint; ++step) {
    absl::Status s = PushStep(*ca, step);
    ASSERT_TRUE(s.ok()) << step << ": " << s;
  }
  auto ckpt = ca->Checkpoint(ckpt_dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ(ckpt->size(), 1u);
  const std::vector<float> saved = PullAll(*ca, kStepsBeforeCheckpoint);
  const v1::TableStatus at_checkpoint = FirstTableOf(*ca);
  ASSERT_GT(at_checkpoint.rows_on_disk(), 0u) << "the checkpoint covers rows on disk too";

  // Pushes go on, every one spilling cold rows to make room; SIGKILL lands among them.
  std::atomic<int> pushed{0};
  std::thread pusher([&] {
    for (int step = kStepsBeforeCheckpoint; step < kStepsBeforeCheckpoint + 100000; ++step) {
      if (!PushStep(*ca, step).ok()) return;  // The server is gone.
      pushed.fetch_add(1);
    }
  });
  while (pushed.load() < 15 && a.daemon->running()) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(a.daemon->Signal(SIGKILL), 128 + SIGKILL);
  pusher.join();
  ca.reset();
  const std::set<std::string> killed_dbs = Databases(spill_dir);
  ASSERT_FALSE(killed_dbs.empty()) << "the killed server's disk tier stays behind";

  // Server B on the same directory: the killed server's databases are removed at start, and the
  // checkpoint restores both tiers bit for bit (rows pushed after it are lost, as without a disk
  // tier: the job's rollback replays those steps).
  TieredServer b = StartTieredServer("b", kCap, spill_dir);
  ASSERT_FALSE(b.address.empty()) << b.daemon->Log();
  for (const std::string& db : killed_dbs) {
    EXPECT_EQ(Databases(spill_dir).count(db), 0u) << db << " of the killed server is still there";
    EXPECT_NE(b.daemon->Log().find(db), std::string::npos) << "the removal is logged";
  }
  std::unique_ptr<PsClient> cb = JobClient(b, Emb());
  ASSERT_NE(cb, nullptr);
  EXPECT_EQ(RestoreOn(b, (*ckpt)[0].path()), (*ckpt)[0].step());
  EXPECT_TRUE(PullAll(*cb, kStepsBeforeCheckpoint) == saved) << "bit for bit, both tiers";
  const v1::TableStatus restored = FirstTableOf(*cb);
  EXPECT_EQ(restored.rows(), at_checkpoint.rows());
  EXPECT_GT(restored.rows_on_disk(), 0u) << "B is capped too: the restore spilled";

  // Server C on the same directory while B lives: B's databases are B's, C leaves them.
  const std::set<std::string> live_dbs = Databases(spill_dir);
  ASSERT_FALSE(live_dbs.empty());
  TieredServer c = StartTieredServer("c", kCap, spill_dir);
  ASSERT_FALSE(c.address.empty()) << c.daemon->Log();
  EXPECT_EQ(Databases(spill_dir), live_dbs);
  EXPECT_TRUE(PullAll(*cb, kStepsBeforeCheckpoint) == saved) << "B still reads its disk tier";
  for (int step = kStepsBeforeCheckpoint; step < kStepsBeforeCheckpoint + 5; ++step) {
    absl::Status s = PushStep(*cb, step);
    EXPECT_TRUE(s.ok()) << step << ": " << s;
  }
}

}  // namespace
}  // namespace pscluster
