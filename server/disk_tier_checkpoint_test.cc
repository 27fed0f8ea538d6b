// A table far larger than its server's memory cap, checkpointed and restored by the real
// ps_server binary: the checkpoint streams both tiers to the file and the restore reads the file
// a piece at a time, so neither holds the table in memory (the process's peak resident memory,
// VmHWM, grows by a small fraction of the table's bytes), and the restored rows are the saved
// ones bit for bit.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/testing/tiered_daemon.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

using namespace ::pscluster::testing::big_table;  // NOLINT

uint64_t PeakRss(pid_t pid) { return ProcStatusBytes(pid, "VmHWM"); }

struct Server {
  TieredServer server;
  std::unique_ptr<PsClient> client;
};

Server Start(const std::string& tag) {
  const std::string spill_dir = TempDir(tag + ".spill");
  EXPECT_EQ(mkdir(spill_dir.c_str(), 0755), 0);
  Server s{StartTieredServer(tag, kCap, spill_dir), nullptr};
  if (!s.server.address.empty()) s.client = JobClient(s.server, Emb(), absl::Seconds(120));
  return s;
}

// Every 16th key's row.
std::vector<float> PullSample(PsClient& client, int64_t clock) {
  return PullEvery(client, "emb", kKeys, 16, kWidth, clock);
}

TEST(DiskTierCheckpointTest, ATableThirtyTimesTheCapIsCheckpointedAndRestoredInBoundedMemory) {
  Server a = Start("a");
  ASSERT_NE(a.client, nullptr) << a.server.daemon->Log();
  // Every key pushed once (each row becomes the initializer's value moved by one Adagrad step).
  const int64_t step = PushEveryKey(*a.client, "emb", kKeys, kWidth, kPerPush);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const v1::TableStatus filled = FirstTableOf(*a.client);
  ASSERT_EQ(filled.rows(), kKeys);
  ASSERT_GT(filled.rows_on_disk(), kKeys * 9 / 10) << "most of the table is on disk";
  const std::vector<float> saved = PullSample(*a.client, step);
  const uint64_t before = PeakRss(a.server.daemon->pid());

  auto ckpt = a.client->Checkpoint(TempDir("ckpt"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ(ckpt->size(), 1u);
  const uint64_t after = PeakRss(a.server.daemon->pid());
  struct stat st;
  ASSERT_EQ(stat((*ckpt)[0].path().c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), (*ckpt)[0].bytes());
  EXPECT_GT((*ckpt)[0].bytes(), kTableBytes) << "rows, keys and step counts of both tiers";
  std::printf("checkpoint: %.1f MiB file; server peak RSS %.1f -> %.1f MiB\n",
              (*ckpt)[0].bytes() / double(kMiB), before / double(kMiB), after / double(kMiB));
  EXPECT_LT(after - before, kTableBytes / 8)
      << "the checkpoint of a " << kTableBytes / kMiB << " MiB table raised the peak RSS by "
      << (after - before) / kMiB << " MiB";

  // A second capped server restores it: a piece of the file at a time, spilling as it fills.
  Server b = Start("b");
  ASSERT_NE(b.client, nullptr) << b.server.daemon->Log();
  const uint64_t b_before = PeakRss(b.server.daemon->pid());
  EXPECT_EQ(RestoreOn(b.server, (*ckpt)[0].path()), (*ckpt)[0].step());
  const uint64_t b_after = PeakRss(b.server.daemon->pid());
  std::printf("restore: server peak RSS %.1f -> %.1f MiB (the filling server's: %.1f)\n",
              b_before / double(kMiB), b_after / double(kMiB), before / double(kMiB));
  // (A quarter of the table's bytes: rows beyond the cap go straight to the disk tier in batches,
  // faster than spilling them one by one, so RocksDB's two memtables fill before their flushes
  // end. Holding the file in memory took it to 287 MiB.)
  EXPECT_LT(b_after, before + kTableBytes / 4)
      << "restoring a " << kTableBytes / kMiB << " MiB table took the peak RSS to "
      << b_after / kMiB << " MiB; filling it had taken " << before / kMiB << " MiB";
  const v1::TableStatus back = FirstTableOf(*b.client);
  EXPECT_EQ(back.rows(), kKeys);
  EXPECT_GT(back.rows_on_disk(), kKeys * 9 / 10);
  EXPECT_TRUE(PullSample(*b.client, step) == saved) << "bit for bit, both tiers";
}

}  // namespace
}  // namespace pscluster
