// Admission and expiry with replication: a backup follows its primary's decisions
// (PushChunk.row_decisions), so the copy that takes over after a loss holds, bit for bit, the
// rows a single server without a loss holds after the same pushes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/metrics.h"
#include "server/ps_metrics.h"
#include "server/testing/cluster.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

v1::ConsistencySpec Bsp() {
  v1::ConsistencySpec c;
  c.set_mode(v1::ConsistencySpec::BSP);
  return c;
}

v1::TableSpec EmbeddingTable() {
  v1::TableSpec t = SparseSpec("emb", 4, 0, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.1f));
  t.mutable_embedding()->set_admit_after_pushes(2);
  t.mutable_embedding()->set_admit_sketch_bytes(1024);  // Small: collisions admit some early.
  t.mutable_embedding()->set_expire_after_steps(3);
  return t;
}

// The keys and gradients of step `step`: 60 distinct keys of 0..299.
void StepData(int step, std::vector<uint64_t>* keys, std::vector<float>* grads) {
  keys->clear();
  std::vector<bool> seen(300);
  uint64_t x = 977 + step;
  while (keys->size() < 60) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const uint64_t k = (x >> 33) % (step < 6 ? 120 : 300);
    if (!seen[k]) keys->push_back(k), seen[k] = true;
  }
  grads->resize(keys->size() * 4);
  for (size_t i = 0; i < grads->size(); ++i) (*grads)[i] = 0.01f * ((i * 7 + step) % 13) - 0.06f;
}

TEST(EmbeddingReplicationTest, TheCopyThatTakesOverMatchesAnUnreplicatedRun) {
  const v1::TableSpec emb = EmbeddingTable();
  std::vector<uint64_t> all(300);
  for (uint64_t k = 0; k < all.size(); ++k) all[k] = k;
  constexpr int kSteps = 12;

  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  for (int i = 0; i < 2; ++i) cluster.server(i)->handler()->set_node_id("s" + std::to_string(i));
  PsClientOptions opts;
  opts.job_id = "job";
  opts.call_timeout = absl::Seconds(20);
  auto client = PsClient::Create(opts, ReplicatedMap("job", 1, cluster.addresses()), {emb});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->InstallShardMap().ok());
  ASSERT_TRUE((*client)->CreateTables(Bsp(), 1).ok());
  std::vector<uint64_t> keys;
  std::vector<float> grads;
  for (int step = 0; step < kSteps; ++step) {
    StepData(step, &keys, &grads);
    ASSERT_TRUE((*client)->Push(step, {{}, {{"emb", keys, grads.data()}}}).ok()) << step;
  }
  uint64_t admissions = 0, counted = 0, expiries = 0;
  auto statuses = (*client)->ServerStatuses();
  ASSERT_TRUE(statuses.ok()) << statuses.status();
  for (const auto& st : *statuses) {
    admissions += st.jobs(0).tables(0).admissions();
    counted += st.jobs(0).tables(0).pushes_not_admitted();
    expiries += st.jobs(0).tables(0).expiries();
  }
  EXPECT_GT(admissions, 0u);
  EXPECT_GT(counted, 0u);
  EXPECT_GT(expiries, 0u);
  std::vector<float> before_loss(all.size() * 4);
  ASSERT_TRUE((*client)->Pull(kSteps, {{}, {{"emb", all, before_loss.data()}}}).ok());

  // s0 is lost: s1 takes over its copy of s0's shards.
  v1::ShardMap promoted = RoundRobinMap("job", 2, {cluster.addresses()[1]});
  for (auto& a : *promoted.mutable_assignments()) a.set_primary("s1");
  promoted.mutable_servers(0)->set_node_id("s1");
  v1::UpdateShardMapRequest req;
  *req.mutable_map() = promoted;
  req.set_self("s1");
  v1::UpdateShardMapResponse resp;
  ASSERT_TRUE(cluster.server(1)->handler()->UpdateShardMap(req, &resp).ok());
  opts.attempt = 1;
  auto resumed = PsClient::Create(opts, promoted, {emb});
  ASSERT_TRUE(resumed.ok());
  std::vector<float> got(all.size() * 4);
  ASSERT_TRUE((*resumed)->Pull(kSteps, {{}, {{"emb", all, got.data()}}}).ok());

  EXPECT_EQ(got, before_loss) << "the copy is bit for bit what its primary had";
}

// Pulls create no rows on a server of a replicated job either, and a later push starts from the
// values those pulls read.
TEST(EmbeddingReplicationTest, PullsCreateNoRowsAndPushesStartFromWhatTheyRead) {
  InProcessCluster cluster(2);
  ASSERT_TRUE(cluster.status().ok());
  v1::TableSpec emb = SparseSpec("emb", 4, 0, Optimizer(v1::OptimizerSpec::SGD, 0.5f));
  auto client = cluster.Client("job", {emb});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTables(Bsp(), 1).ok());
  std::vector<uint64_t> keys = {3, 77, 1u << 20, 123456789};
  std::vector<float> first(16), second(16), grads(16, 1.f);
  ASSERT_TRUE((*client)->Pull(0, {{}, {{"emb", keys, first.data()}}}).ok());
  ASSERT_TRUE((*client)->Pull(0, {{}, {{"emb", keys, second.data()}}}).ok());
  EXPECT_EQ(first, second);
  auto statuses = (*client)->ServerStatuses();
  ASSERT_TRUE(statuses.ok());
  for (const auto& st : *statuses) EXPECT_EQ(st.jobs(0).tables(0).rows(), 0u);
  ASSERT_TRUE((*client)->Push(0, {{}, {{"emb", keys, grads.data()}}}).ok());
  ASSERT_TRUE((*client)->Pull(1, {{}, {{"emb", keys, second.data()}}}).ok());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(second[i], first[i] - 0.5f) << i;
}

TEST(EmbeddingMetricsTest, StatusAndMetricsCountAdmissionsAndReadsWithoutRows) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok());
  auto client = cluster.Client("job", {EmbeddingTable()});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTables(Bsp(), 1).ok());
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> g(12, 1.f), got(12);
  ASSERT_TRUE((*client)->Push(0, {{}, {{"emb", keys, g.data()}}}).ok());
  ASSERT_TRUE((*client)->Push(1, {{}, {{"emb", {keys.data(), 1}, g.data()}}}).ok());
  ASSERT_TRUE((*client)->Pull(2, {{}, {{"emb", keys, got.data()}}}).ok());
  v1::ServerStatusRequest req;
  v1::ServerStatus st;
  ASSERT_TRUE(cluster.server(0)->handler()->Status(req, &st).ok());
  const v1::TableStatus& t = st.jobs(0).tables(0);
  EXPECT_EQ(t.rows(), 1u);
  EXPECT_EQ(t.admissions(), 1u);
  EXPECT_EQ(t.pushes_not_admitted(), 3u);
  EXPECT_EQ(t.reads_without_row(), 2u);
  EXPECT_EQ(t.sketch_bytes(), 1024u);
  MetricsRegistry registry;
  RegisterServerMetrics(cluster.server(0)->handler(), &registry);
  const std::string page = registry.Render();
  for (const char* line : {"pscluster_table_rows{job=\"job\",table=\"emb\"} 1\n",
                           "pscluster_table_admissions_total{job=\"job\",table=\"emb\"} 1\n",
                           "pscluster_table_pushes_not_admitted_total{job=\"job\",table=\"emb\"} 3\n",
                           "pscluster_table_reads_without_row_total{job=\"job\",table=\"emb\"} 2\n",
                           "pscluster_table_expiries_total{job=\"job\",table=\"emb\"} 0\n"}) {
    EXPECT_NE(page.find(line), std::string::npos) << line << page;
  }
}

TEST(EmbeddingReplicationTest, AWorkerCannotSetRowDecisions) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok());
  auto client = cluster.Client("job", {EmbeddingTable()});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTables(Bsp(), 1).ok());
  v1::PushChunk chunk;
  chunk.mutable_tag()->set_job_id("job");
  chunk.mutable_slice()->set_table("emb");
  chunk.set_row_decisions(std::string(1, '\1'));
  auto r = cluster.server(0)->handler()->Push(chunk, Payload());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("row_decisions"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace pscluster
