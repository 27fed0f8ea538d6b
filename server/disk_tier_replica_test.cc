// A live copy of a table far larger than its servers' memory caps (the real ps_server binary,
// two of them, each with a cap and a disk tier): the primary's snapshot for its new backup is
// spooled to local disk and sent a part at a time, and the backup spools what arrives and loads
// it from there, so neither server holds the table in memory (each one's peak resident memory,
// VmHWM, grows by a small fraction of the table's bytes); the copy, promoted (handed to the
// backup's own copy of the job, spooled too), serves the primary's rows bit for bit; and no spool
// file outlives its use.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/testing/tiered_daemon.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

using namespace ::pscluster::testing::big_table;  // NOLINT
// What a new disk tier costs outside the cap, whatever its size: RocksDB's two memtables of
// 32 MiB (README, "Outside the cap").
constexpr uint64_t kTierOverhead = 64 * kMiB;
// The bound on what moving the table may add: a quarter of its bytes (holding it in memory
// would add all of them, and more: 147 MiB on the primary and 214 on the backup, measured).
constexpr uint64_t kSlack = kTableBytes / 4;

// The files process `pid` has open that were spooled (see server/spool_file.h).
int OpenSpoolFiles(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  int n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      char target[4096];
      const ssize_t len =
          readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
      if (len > 0 && absl::StrContains(absl::string_view(target, len), "/.spool.")) ++n;
    }
    closedir(d);
  }
  return n;
}

TieredServer Start(const std::string& tag) {
  const std::string spill_dir = TempDir(tag + ".spill");
  EXPECT_EQ(mkdir(spill_dir.c_str(), 0755), 0);
  return StartTieredServer(tag, kCap, spill_dir);
}

// Every shard's primary is `primary`; with `backup`, each is backed up there.
v1::ShardMap Map(uint64_t epoch, const std::vector<std::string>& addresses,
                 const std::string& primary, const std::string& backup) {
  v1::ShardMap m = RoundRobinMap("job", epoch, addresses, 4);
  for (auto& a : *m.mutable_assignments()) {
    a.set_primary(primary);
    if (!backup.empty()) a.add_backups(backup);
  }
  return m;
}

absl::Status Update(const std::string& address, const v1::ShardMap& map, const std::string& self,
                    bool seed_new_backups, const std::string& live_copy_of) {
  auto stub = v1::ParameterServer::NewStub(*MakeChannel(address));
  v1::UpdateShardMapRequest req;
  *req.mutable_map() = map;
  req.set_self(self);
  req.set_seed_new_backups(seed_new_backups);
  if (!live_copy_of.empty()) {
    v1::ReplicaSeed* seed = req.add_copy_from();
    seed->set_primary(live_copy_of);
    seed->set_live(true);
  }
  v1::UpdateShardMapResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(600)));
  grpc::Status st = stub->UpdateShardMap(&ctx, req, &resp);
  return st.ok() ? absl::OkStatus() : absl::UnknownError(st.error_message());
}

// Whether the server at `address` holds a seeded copy of `primary`'s shards of job "job".
bool Seeded(const std::string& address, const std::string& primary) {
  auto stub = v1::ParameterServer::NewStub(*MakeChannel(address));
  v1::ServerStatusRequest req;
  v1::ServerStatus resp;
  grpc::ClientContext ctx;
  if (!stub->Status(&ctx, req, &resp).ok()) return false;
  for (const auto& job : resp.jobs()) {
    for (const auto& r : job.replicas()) {
      if (r.primary() == primary && r.seeded()) return true;
    }
  }
  return false;
}

std::vector<float> PullSample(PsClient& client, int64_t clock) {
  return PullEvery(client, "emb", kKeys, 16, kWidth, clock);
}

TEST(DiskTierReplicaTest, ALiveCopyOfATableThirtyTimesTheCapIsSeededInBoundedMemory) {
  TieredServer a = Start("a");
  TieredServer b = Start("b");
  ASSERT_FALSE(a.address.empty());
  ASSERT_FALSE(b.address.empty());
  const std::vector<std::string> addresses = {a.address, b.address};

  // Map 1: every shard on s0 (a), no backups; the job's tables on both servers.
  std::unique_ptr<PsClient> client =
      ClientOnMap(Map(1, addresses, "s0", ""), Emb(), absl::Seconds(120));
  ASSERT_NE(client, nullptr);
  const int64_t step = PushEveryKey(*client, "emb", kKeys, kWidth, kPerPush, 31);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::vector<float> saved = PullSample(*client, step);
  const v1::TableStatus filled = FirstTableOf(*client);
  ASSERT_EQ(filled.rows(), kKeys);
  ASSERT_GT(filled.rows_on_disk(), kKeys * 9 / 10) << "most of the table is on disk";

  // Map 2: b backs every shard of a with a live copy (b takes the map first and waits for the
  // snapshot a takes as the map takes effect there).
  const uint64_t a_before = ProcStatusBytes(a.daemon->pid(), "VmHWM");
  const uint64_t b_before = ProcStatusBytes(b.daemon->pid(), "VmHWM");
  const v1::ShardMap map2 = Map(2, addresses, "s0", "s1");
  const absl::Time seed_start = absl::Now();
  ASSERT_TRUE(Update(b.address, map2, "s1", true, "s0").ok());
  ASSERT_TRUE(Update(a.address, map2, "s0", true, "").ok());
  const absl::Time give_up = absl::Now() + absl::Seconds(600);
  while (!Seeded(b.address, "s0") && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(Seeded(b.address, "s0")) << b.daemon->Log();
  std::printf("seeded in %.1f s\n", absl::ToDoubleSeconds(absl::Now() - seed_start));
  const uint64_t a_after = ProcStatusBytes(a.daemon->pid(), "VmHWM");
  const uint64_t b_after = ProcStatusBytes(b.daemon->pid(), "VmHWM");
  std::printf("seed of a %.0f MiB table: primary's peak RSS %.1f -> %.1f MiB, backup's %.1f -> "
              "%.1f MiB\n", kTableBytes / double(kMiB), a_before / double(kMiB),
              a_after / double(kMiB), b_before / double(kMiB), b_after / double(kMiB));
  EXPECT_LT(a_after - a_before, kSlack)
      << "the primary's snapshot of a " << kTableBytes / kMiB << " MiB table raised its peak RSS "
      << "by " << (a_after - a_before) / kMiB << " MiB";
  EXPECT_LT(b_after, a_before + kSlack)
      << "loading the copy took the backup's peak RSS to " << b_after / kMiB
      << " MiB; filling the table had taken the primary's to " << a_before / kMiB << " MiB";
  EXPECT_NE(b.daemon->Log().find("spooled to disk"), std::string::npos) << b.daemon->Log();
  // The primary's spool file goes once its last part was delivered; the backup's once loaded.
  const absl::Time released = absl::Now() + absl::Seconds(10);
  while (OpenSpoolFiles(a.daemon->pid()) > 0 && absl::Now() < released) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(OpenSpoolFiles(a.daemon->pid()), 0);
  EXPECT_EQ(OpenSpoolFiles(b.daemon->pid()), 0);

  // Map 3: a is lost; b takes over as primary of every shard, and serves what a held.
  v1::ShardMap map3 = Map(3, {b.address}, "s0", "");
  map3.mutable_servers(0)->set_node_id("s1");
  for (auto& as : *map3.mutable_assignments()) as.set_primary("s1");
  a.daemon.reset();
  const absl::Time takeover_start = absl::Now();
  ASSERT_TRUE(Update(b.address, map3, "s1", false, "").ok());
  std::printf("taken over in %.1f s\n", absl::ToDoubleSeconds(absl::Now() - takeover_start));
  // The copy handed its shards to b's own copy of the job through a spool file as well.
  const uint64_t b_promoted = ProcStatusBytes(b.daemon->pid(), "VmHWM");
  std::printf("promotion: the backup's peak RSS %.1f -> %.1f MiB\n", b_after / double(kMiB),
              b_promoted / double(kMiB));
  EXPECT_LT(b_promoted - b_after, kTierOverhead + kSlack)
      << "taking over a " << kTableBytes / kMiB << " MiB copy raised the peak RSS by "
      << (b_promoted - b_after) / kMiB << " MiB";
  EXPECT_EQ(OpenSpoolFiles(b.daemon->pid()), 0);
  PsClientOptions o;
  o.job_id = "job";
  o.call_timeout = absl::Seconds(120);
  o.attempt = 1;
  auto resumed = PsClient::Create(o, map3, {Emb()});
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  const v1::TableStatus copy = FirstTableOf(**resumed);
  EXPECT_EQ(copy.rows(), kKeys);
  EXPECT_GT(copy.rows_on_disk(), kKeys * 9 / 10) << "the copy spilled as it loaded";
  EXPECT_TRUE(PullSample(**resumed, step) == saved) << "bit for bit, both tiers";
}

// Whether this process may mount a file system in a mount namespace of its own (root).
bool CanMountTmpfs() {
  return std::system("unshare -m --propagation private sh -c "
                     "'mount -t tmpfs -o size=1m tmpfs /mnt' >/dev/null 2>&1") == 0;
}

// A backup whose disk fills while its live copy's snapshot arrives: the part is refused naming
// the directory and what filled; the backup keeps serving; the primary, after its retries, reports
// the backup unreachable (its pushes fail until the map drops that backup, as for any backup that
// cannot take its copies), loses nothing, and trains on once the map no longer names it.
TEST(DiskTierReplicaTest, ABackupWhoseDiskFillsWhileItsSeedArrivesRefusesItAndNothingIsLost) {
  if (!CanMountTmpfs()) GTEST_SKIP() << "needs root to mount a small tmpfs (unshare -m)";
  constexpr uint64_t kFewKeys = 200000;  // 24 MiB of rows, on an 8 MiB disk.
  TieredServer a = Start("full_a");
  const std::string small_dir = TempDir("full_b.spill");
  ASSERT_EQ(mkdir(small_dir.c_str(), 0755), 0);
  const std::string port_file = TempDir("full_b.port");
  TieredServer b;
  b.daemon = std::make_unique<Daemon>(
      "/usr/bin/unshare",
      std::vector<std::string>{
          "-m", "--propagation", "private", "sh", "-c",
          absl::StrCat("mount -t tmpfs -o size=8m tmpfs ", small_dir, " && exec ",
                       RunfilePath("server/ps_server"),
                       " --listen=127.0.0.1:0 --port_file=", port_file, " --memory_bytes=", kCap,
                       " --spill_dir=", small_dir, " --log_level=info")},
      TempDir("full_b.log"));
  auto address = b.daemon->WaitForPortFile(port_file);
  ASSERT_TRUE(address.ok()) << address.status() << b.daemon->Log();
  b.address = *address;
  ASSERT_FALSE(a.address.empty());
  const std::vector<std::string> addresses = {a.address, b.address};

  std::unique_ptr<PsClient> client =
      ClientOnMap(Map(1, addresses, "s0", ""), Emb(), absl::Seconds(60));
  ASSERT_NE(client, nullptr);
  const int64_t step = PushEveryKey(*client, "emb", kFewKeys, kWidth, kPerPush);
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::vector<uint64_t> sample;
  for (uint64_t k = 0; k < kFewKeys; k += 7) sample.push_back(k);
  std::vector<float> saved(sample.size() * kWidth), got(saved.size());
  ASSERT_TRUE(client->Pull(step, {{}, {{"emb", sample, saved.data()}}}).ok());

  const v1::ShardMap map2 = Map(2, addresses, "s0", "s1");
  ASSERT_TRUE(Update(b.address, map2, "s1", true, "s0").ok());
  ASSERT_TRUE(Update(a.address, map2, "s0", true, "").ok());
  // The primary retries each call for 10 s (the daemon's replication retry), then gives the
  // backup up.
  auto unreachable = [&] {
    auto stub = v1::ParameterServer::NewStub(*MakeChannel(a.address));
    v1::ServerStatusRequest req;
    v1::ServerStatus resp;
    grpc::ClientContext ctx;
    grpc::Status st = stub->Status(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    for (const auto& j : resp.jobs()) {
      for (const auto& u : j.unreachable_backups()) {
        if (u == b.address) return true;
      }
    }
    return false;
  };
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (!unreachable() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(unreachable()) << "the primary reports the backup it could not seed";
  // Both sides say what filled, where.
  for (Daemon* d : {a.daemon.get(), b.daemon.get()}) {
    const std::string log = d->Log();
    EXPECT_NE(log.find(absl::StrCat("spool file in ", small_dir, ": No space left on device")),
              std::string::npos)
        << log;
  }
  EXPECT_FALSE(Seeded(b.address, "s0"));
  EXPECT_TRUE(b.daemon->running()) << "the backup keeps serving";

  // Nothing is lost; with the backup dropped from the map, the job trains on.
  const v1::ShardMap map3 = Map(3, addresses, "s0", "");
  ASSERT_TRUE(Update(a.address, map3, "s0", false, "").ok());
  ASSERT_TRUE(Update(b.address, map3, "s1", false, "").ok());
  PsClientOptions o;
  o.job_id = "job";
  o.call_timeout = absl::Seconds(60);
  auto again = PsClient::Create(o, map3, {Emb()});
  ASSERT_TRUE(again.ok());
  absl::Status pulled = (*again)->Pull(step, {{}, {{"emb", sample, got.data()}}});
  ASSERT_TRUE(pulled.ok()) << pulled;
  EXPECT_TRUE(got == saved);
  const std::vector<uint64_t> keys(sample.begin(), sample.begin() + 100);
  const std::vector<float> g(keys.size() * kWidth, 0.01f);
  absl::Status pushed = (*again)->Push(step, {{}, {{"emb", keys, g.data()}}});
  EXPECT_TRUE(pushed.ok()) << pushed;
}

}  // namespace
}  // namespace pscluster
