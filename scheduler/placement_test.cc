#include "scheduler/placement.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/status_matchers.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;

std::vector<ServerCandidate> Servers(int n, uint64_t mem = 4 * kGiB) {
  std::vector<ServerCandidate> out;
  for (int i = 0; i < n; ++i) {
    ServerCandidate s;
    s.node_id = absl::StrCat("server-", i + 1);
    s.address = absl::StrCat("10.0.0.", i + 1, ":7000");
    s.memory_bytes = mem;
    out.push_back(s);
  }
  return out;
}

std::vector<WorkerCandidate> Workers(int n, uint32_t gpus = 0, uint32_t slots = 1) {
  std::vector<WorkerCandidate> out;
  for (int i = 0; i < n; ++i) {
    WorkerCandidate w;
    w.node_id = absl::StrCat("worker-", i + 1);
    w.address = absl::StrCat("10.0.1.", i + 1, ":7000");
    w.gpus = gpus;
    w.cpu_slots = slots;
    out.push_back(w);
  }
  return out;
}

PlacementRequest Request(uint32_t servers, uint32_t workers, uint32_t shards = 64) {
  PlacementRequest r;
  r.job_id = "job-1";
  r.num_servers = servers;
  r.num_workers = workers;
  r.num_virtual_shards = shards;
  return r;
}

std::map<std::string, int> PrimaryCounts(const v1::ShardMap& map) {
  std::map<std::string, int> c;
  for (const auto& a : map.assignments()) ++c[a.primary()];
  return c;
}

TEST(PlacementTest, SpreadsShardsEvenlyOverEqualServers) {
  CapacityPlacement p;
  auto placed = p.Place(Request(4, 2), Servers(6), Workers(3));
  ASSERT_THAT(placed, IsOk());
  const v1::ShardMap& map = placed->shard_map;
  EXPECT_EQ(map.job_id(), "job-1");
  EXPECT_EQ(map.epoch(), 1u);
  EXPECT_EQ(map.num_virtual_shards(), 64u);
  EXPECT_THAT(CheckShardMap(map), IsOk());
  EXPECT_EQ(placed->servers.size(), 4u);
  auto counts = PrimaryCounts(map);
  ASSERT_EQ(counts.size(), 4u);
  for (const auto& [id, n] : counts) EXPECT_EQ(n, 16) << id;
  EXPECT_EQ(placed->workers.size(), 2u);
}

TEST(PlacementTest, MoreFreeMemoryGetsMoreShards) {
  auto servers = Servers(2);
  servers[0].memory_bytes = 8 * kGiB;
  servers[1].memory_bytes = 8 * kGiB;
  servers[1].memory_used_bytes = 6 * kGiB;  // 8 GiB free vs 2 GiB free.
  CapacityPlacement p;
  auto placed = p.Place(Request(2, 1, 100), servers, Workers(1));
  ASSERT_THAT(placed, IsOk());
  auto counts = PrimaryCounts(placed->shard_map);
  EXPECT_EQ(counts["server-1"], 80);
  EXPECT_EQ(counts["server-2"], 20);
}

TEST(PlacementTest, ChoosesTheLeastLoadedServers) {
  auto servers = Servers(4);
  servers[0].shards_hosted = 64;        // Busy with another job.
  servers[2].bytes_per_sec = 500e6;     // Hot.
  CapacityPlacement p;
  auto placed = p.Place(Request(2, 1), servers, Workers(1));
  ASSERT_THAT(placed, IsOk());
  std::set<std::string> chosen(placed->servers.begin(), placed->servers.end());
  EXPECT_EQ(chosen, (std::set<std::string>{"server-2", "server-4"}));
}

TEST(PlacementTest, BackupsLiveOnOtherServers) {
  CapacityPlacement p;
  auto req = Request(3, 1, 30);
  req.replication = 3;
  auto placed = p.Place(req, Servers(3), Workers(1));
  ASSERT_THAT(placed, IsOk());
  EXPECT_THAT(CheckShardMap(placed->shard_map), IsOk());
  std::map<std::string, int> backups;
  for (const auto& a : placed->shard_map.assignments()) {
    ASSERT_EQ(a.backups_size(), 2);
    std::set<std::string> holders = {a.primary(), a.backups(0), a.backups(1)};
    EXPECT_EQ(holders.size(), 3u) << a.DebugString();
    for (const auto& b : a.backups()) ++backups[b];
  }
  for (const auto& [id, n] : backups) EXPECT_EQ(n, 20) << id;
}

TEST(PlacementTest, GpuJobsTakeBestFittingWorkersAndCpuJobsSpareGpus) {
  std::vector<WorkerCandidate> workers = Workers(4);
  workers[0].gpus = 8;
  workers[1].gpus = 2;
  workers[2].gpus = 0;
  workers[3].gpus = 1;
  CapacityPlacement p;
  auto req = Request(1, 2);
  req.gpus_per_worker = 2;
  auto placed = p.Place(req, Servers(1), workers);
  ASSERT_THAT(placed, IsOk());
  EXPECT_THAT(placed->workers, ElementsAre("worker-2", "worker-1"));

  req.gpus_per_worker = 0;
  placed = p.Place(req, Servers(1), workers);
  ASSERT_THAT(placed, IsOk());
  EXPECT_THAT(placed->workers, ElementsAre("worker-3", "worker-4"));
}

TEST(PlacementTest, ShortagesAreResourceExhaustedWithCounts) {
  CapacityPlacement p;
  EXPECT_THAT(p.Place(Request(3, 1), Servers(2), Workers(1)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("needs 3 servers, 2 available")));
  EXPECT_THAT(p.Place(Request(1, 4), Servers(2), Workers(3)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("needs 4 idle workers, 3 available")));
  auto req = Request(1, 1);
  req.gpus_per_worker = 1;
  EXPECT_THAT(p.Place(req, Servers(1), Workers(2)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("needs 1 idle workers with >= 1 free GPUs, 0 available")));
}

TEST(PlacementTest, ImpossibleRequestsAreInvalid) {
  CapacityPlacement p;
  EXPECT_THAT(p.Place(Request(4, 1, 2), Servers(4), Workers(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_virtual_shards")));
  auto req = Request(2, 1);
  req.replication = 3;
  EXPECT_THAT(p.Place(req, Servers(4), Workers(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("replication")));
}

TEST(PlacementTest, ReplaceMovesOnlyTheDeadServersShards) {
  CapacityPlacement p;
  auto servers = Servers(4);
  auto placed = p.Place(Request(4, 1), servers, Workers(1));
  ASSERT_THAT(placed, IsOk());
  const v1::ShardMap& before = placed->shard_map;
  servers.erase(servers.begin() + 1);  // server-2 died.
  auto after = p.Replace(before, "server-2", servers);
  ASSERT_THAT(after, IsOk());
  EXPECT_EQ(after->epoch(), 2u);
  EXPECT_THAT(CheckShardMap(*after), IsOk());
  int moved = 0;
  for (int i = 0; i < before.assignments_size(); ++i) {
    const auto& a = before.assignments(i);
    const auto& b = after->assignments(i);
    EXPECT_NE(b.primary(), "server-2");
    if (a.primary() != "server-2") {
      EXPECT_EQ(a.primary(), b.primary()) << "shard " << i << " moved needlessly";
    } else {
      ++moved;
    }
  }
  EXPECT_EQ(moved, 16);
  auto counts = PrimaryCounts(*after);
  for (const auto& [id, n] : counts) {
    EXPECT_GE(n, 21) << id;
    EXPECT_LE(n, 22) << id;
  }
  for (const auto& ep : after->servers()) EXPECT_NE(ep.node_id(), "server-2");
}

TEST(PlacementTest, ReplacePromotesABackup) {
  CapacityPlacement p;
  auto servers = Servers(3);
  auto req = Request(3, 1, 9);
  req.replication = 2;
  auto placed = p.Place(req, servers, Workers(1));
  ASSERT_THAT(placed, IsOk());
  servers.erase(servers.begin());  // server-1 died.
  auto after = p.Replace(placed->shard_map, "server-1", servers);
  ASSERT_THAT(after, IsOk());
  EXPECT_THAT(CheckShardMap(*after), IsOk());
  for (int i = 0; i < after->assignments_size(); ++i) {
    const auto& was = placed->shard_map.assignments(i);
    const auto& now = after->assignments(i);
    if (was.primary() == "server-1") {
      EXPECT_EQ(now.primary(), was.backups(0));
    }
    EXPECT_EQ(now.backups_size(), 1) << now.DebugString();
    EXPECT_NE(now.backups(0), now.primary());
  }
}

TEST(PlacementTest, ReplaceWithNoServerLeftIsUnavailable) {
  CapacityPlacement p;
  auto placed = p.Place(Request(1, 1), Servers(1), Workers(1));
  ASSERT_THAT(placed, IsOk());
  EXPECT_THAT(p.Replace(placed->shard_map, "server-1", {}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("server-1")));
}

TEST(PlacementTest, CheckShardMapCatchesBrokenMaps) {
  CapacityPlacement p;
  auto placed = p.Place(Request(2, 1, 4), Servers(2), Workers(1));
  ASSERT_THAT(placed, IsOk());
  v1::ShardMap m = placed->shard_map;
  m.mutable_assignments()->RemoveLast();
  EXPECT_THAT(CheckShardMap(m), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("3 assignments for 4 virtual shards")));
  m = placed->shard_map;
  m.mutable_assignments(1)->set_primary("server-9");
  EXPECT_THAT(CheckShardMap(m), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("server-9")));
}

}  // namespace
}  // namespace pscluster::scheduler
