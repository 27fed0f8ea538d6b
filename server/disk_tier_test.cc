// A server with a memory cap and a disk tier (--spill_dir), through the data plane: pushes and
// pulls give bit for bit what an uncapped server gives, checkpoints cover both tiers (restored
// on an uncapped server they give the same rows), Status shows the tiers, and a --spill_dir that
// is not a writable directory stops the server at start, naming it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "server/ps_metrics.h"
#include "server/testing/cluster.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

v1::ConsistencySpec Asp() {
  v1::ConsistencySpec c;
  c.set_mode(v1::ConsistencySpec::ASP);
  return c;
}

constexpr int kSteps = 200;
constexpr uint32_t kWidth = 16;
constexpr uint64_t kKeys = 3000;

// The step's 64 distinct keys of 0..kKeys-1, skewed towards small keys.
std::vector<uint64_t> StepKeys(int step) {
  std::vector<uint64_t> keys;
  std::vector<bool> seen(kKeys);
  uint64_t x = 0x9e3779b97f4a7c15ULL * (step + 1);
  while (keys.size() < 64) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const double u = static_cast<double>(x % 1000003) / 1000003.0;
    const uint64_t k = static_cast<uint64_t>(kKeys * u * u * u);
    if (!seen[k]) keys.push_back(k), seen[k] = true;
  }
  return keys;
}

// Runs the pushes on `cluster`; returns every key's row after them.
std::vector<float> Train(InProcessCluster& cluster, const v1::TableSpec& emb) {
  auto client = cluster.Client("job", {emb});
  EXPECT_TRUE(client.ok());
  EXPECT_TRUE((*client)->CreateTables(Asp(), 1).ok());
  std::vector<float> g(64 * kWidth);
  for (int step = 0; step < kSteps; ++step) {
    const auto keys = StepKeys(step);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.001f * static_cast<float>((i + step) % 23) - 0.01f;
    absl::Status s = (*client)->Push(step, {{}, {{"emb", keys, g.data()}}});
    EXPECT_TRUE(s.ok()) << step << ": " << s;
    if (!s.ok()) break;
  }
  std::vector<uint64_t> all(kKeys);
  for (uint64_t k = 0; k < kKeys; ++k) all[k] = k;
  std::vector<float> rows(kKeys * kWidth);
  EXPECT_TRUE((*client)->Pull(kSteps, {{}, {{"emb", all, rows.data()}}}).ok());
  return rows;
}

TEST(DiskTierTest, ACappedServerMatchesAnUncappedOneAndCheckpointsBothTiers) {
  const v1::TableSpec emb =
      SparseSpec("emb", kWidth, kKeys, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.05f));
  const uint64_t row_bytes = kWidth * 2 * sizeof(float);
  InProcessCluster uncapped(1);
  ASSERT_TRUE(uncapped.status().ok());
  const std::vector<float> expected = Train(uncapped, emb);

  PsServerOptions o;
  o.memory_bytes = 300 * row_bytes;
  o.spill_dir = TempDir();
  InProcessCluster capped(1, o);
  ASSERT_TRUE(capped.status().ok()) << capped.status();
  EXPECT_EQ(Train(capped, emb), expected) << "bit for bit, whichever tier each row was in";
  v1::ServerStatus st;
  ASSERT_TRUE(capped.server(0)->handler()->Status(v1::ServerStatusRequest(), &st).ok());
  const v1::TableStatus& t = st.jobs(0).tables(0);
  EXPECT_GT(t.rows_on_disk(), 0u);
  EXPECT_GT(t.spills(), 0u);
  EXPECT_GT(t.ram_hits(), 0u);
  EXPECT_GT(t.disk_reads(), 0u);
  EXPECT_GT(t.updated_on_disk(), 0u);
  EXPECT_LE(t.updated_on_disk(), t.disk_reads());
  EXPECT_LE(t.bytes(), o.memory_bytes);
  EXPECT_EQ(t.bytes(), (t.rows() - t.rows_on_disk()) * row_bytes);
  // /metrics says the same.
  MetricsRegistry registry;
  RegisterServerMetrics(capped.server(0)->handler(), &registry);
  const std::string page = registry.Render();
  const std::string labels = "{job=\"job\",table=\"emb\"} ";
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, uint64_t>>{
           {"pscluster_table_rows_on_disk", t.rows_on_disk()},
           {"pscluster_table_ram_hits_total", t.ram_hits()},
           {"pscluster_table_disk_reads_total", t.disk_reads()},
           {"pscluster_table_spills_total", t.spills()},
           {"pscluster_table_updated_on_disk_total", t.updated_on_disk()}}) {
    const std::string line = absl::StrCat(name, labels, value, "\n");
    EXPECT_NE(page.find(line), std::string::npos) << line << page;
  }
  EXPECT_NE(page.find("pscluster_table_ram_hit_ratio" + labels), std::string::npos) << page;

  // A checkpoint covers both tiers: restored on an uncapped server it gives the same rows.
  v1::CheckpointRequest creq;
  creq.set_job_id("job");
  creq.set_dir(TempDir() + "/ckpt");
  v1::CheckpointResponse cresp;
  absl::Status s = capped.server(0)->handler()->Checkpoint(creq, &cresp);
  ASSERT_TRUE(s.ok()) << s;
  InProcessCluster fresh(1);
  auto client = fresh.Client("job", {emb});
  ASSERT_TRUE((*client)->CreateTables(Asp(), 1).ok());
  v1::RestoreRequest rreq;
  rreq.set_job_id("job");
  rreq.set_path(cresp.path());
  v1::RestoreResponse rresp;
  s = fresh.server(0)->handler()->Restore(rreq, &rresp);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<uint64_t> all(kKeys);
  for (uint64_t k = 0; k < kKeys; ++k) all[k] = k;
  std::vector<float> restored(kKeys * kWidth);
  ASSERT_TRUE((*client)->Pull(kSteps, {{}, {{"emb", all, restored.data()}}}).ok());
  EXPECT_EQ(restored, expected);
  v1::ServerStatus fst;
  ASSERT_TRUE(fresh.server(0)->handler()->Status(v1::ServerStatusRequest(), &fst).ok());
  EXPECT_EQ(fst.jobs(0).tables(0).rows(), t.rows());
}

// ListKeys (what an export over the user's keys writes): two capped servers list, between them,
// every key that was pushed and no other, once each and in order, whether its row is in memory
// or on disk; pages of a few keys (the server's `limit`) give the same keys.
TEST(DiskTierTest, EveryPushedKeyIsListedOnceFromBothTiersOfEveryServer) {
  const v1::TableSpec emb =
      SparseSpec("emb", kWidth, kKeys, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.05f));
  PsServerOptions o;
  o.memory_bytes = 150 * kWidth * 2 * sizeof(float);
  o.spill_dir = TempDir() + "/list";
  ASSERT_EQ(std::system(("mkdir -p " + o.spill_dir).c_str()), 0);
  InProcessCluster capped(2, o);
  ASSERT_TRUE(capped.status().ok()) << capped.status();
  (void)Train(capped, emb);
  std::vector<uint64_t> pushed;
  std::vector<bool> seen(kKeys);
  for (int step = 0; step < kSteps; ++step) {
    for (uint64_t k : StepKeys(step)) seen[k] = true;
  }
  for (uint64_t k = 0; k < kKeys; ++k) {
    if (seen[k]) pushed.push_back(k);
  }
  ASSERT_LT(pushed.size(), kKeys);  // Some keys were never pushed: they have no row.
  auto client = capped.Client("job", {emb});
  ASSERT_TRUE(client.ok());
  auto listed = (*client)->ListKeys("emb", kKeys);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(*listed, pushed);
  uint64_t on_disk = 0, listed_here = 0;
  for (int i = 0; i < 2; ++i) {
    v1::ServerStatus st;
    ASSERT_TRUE(capped.server(i)->handler()->Status(v1::ServerStatusRequest(), &st).ok());
    on_disk += st.jobs(0).tables(0).rows_on_disk();
    // Pages of 7 keys from this server, asked directly.
    v1::ListKeysRequest req;
    req.set_job_id("job");
    req.set_table("emb");
    req.set_limit(7);
    req.set_epoch((*client)->shard_map().epoch());
    uint64_t previous = 0;
    bool first = true;
    for (bool more = true; more;) {
      v1::ListKeysResponse resp;
      absl::Status s =
          capped.server(i)->handler()->ListKeys(req, &resp, PsHandler::GrpcDataProof());
      ASSERT_TRUE(s.ok()) << s;
      const size_t n = resp.keys().size() / 8;
      ASSERT_LE(n, 7u);
      for (size_t j = 0; j < n; ++j) {
        uint64_t k;
        std::memcpy(&k, resp.keys().data() + 8 * j, 8);
        EXPECT_TRUE(first || k > previous) << "server " << i << " key " << k;
        previous = k;
        first = false;
        ++listed_here;
      }
      more = resp.more();
      if (more) req.set_start(previous + 1);
    }
    EXPECT_EQ(st.jobs(0).tables(0).rows(), listed_here) << "server " << i;
    listed_here = 0;
  }
  EXPECT_GT(on_disk, 0u) << "the cap put rows on disk";
  // A caller routing by an older map is told to refresh it.
  v1::ListKeysRequest stale;
  stale.set_job_id("job");
  stale.set_table("emb");
  stale.set_epoch(0);
  v1::ListKeysResponse resp;
  absl::Status s = capped.server(0)->handler()->ListKeys(stale, &resp, PsHandler::GrpcDataProof());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(resp.keys().empty());
}

TEST(DiskTierTest, ASpillDirThatIsNotAWritableDirectoryStopsTheServer) {
  PsServerOptions o;
  o.spill_dir = TempDir() + "/no-such-dir";
  InProcessCluster cluster(1, o);
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cluster.status().message().find("--spill_dir " + o.spill_dir), std::string::npos)
      << cluster.status();
}

}  // namespace
}  // namespace pscluster
