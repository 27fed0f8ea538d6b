// In-process tier: real ps_server instances on loopback port 0, driven through the client
// library and through the generated gRPC stubs.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "common/channel.h"
#include "common/dtype.h"
#include "common/status_convert.h"
#include "server/initializer.h"
#include "server/testing/cluster.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

const v1::OptimizerSpec kSgd = Optimizer(v1::OptimizerSpec::SGD, 0.5f);

std::vector<float> InitialDense(const v1::TableSpec& spec, uint64_t n) {
  std::vector<float> v(n);
  Initializer(spec).FillDense(0, n, v.data());
  return v;
}

std::vector<float> InitialRows(const v1::TableSpec& spec, const std::vector<uint64_t>& keys) {
  std::vector<float> v(keys.size() * spec.row_width());
  Initializer init(spec);
  for (size_t i = 0; i < keys.size(); ++i) {
    init.FillRow(keys[i], spec.row_width(), v.data() + i * spec.row_width());
  }
  return v;
}

class ServiceTest : public ::testing::TestWithParam<int> {};

TEST_P(ServiceTest, PushesAndPullsDenseAndSparseThroughTheClient) {
  InProcessCluster cluster(GetParam());
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  // 10 blocks of 1000 plus a short one; a sparse table with a key space.
  auto w = DenseSpec("fc/w", {10, 1050}, kSgd, 1000);
  auto e = SparseSpec("emb", 16, 1u << 30, kSgd);
  auto client = cluster.Client("job", {w, e});
  ASSERT_TRUE(client.ok()) << client.status();
  v1::ConsistencySpec asp;
  asp.set_mode(v1::ConsistencySpec::ASP);
  ASSERT_TRUE((*client)->CreateTables(asp, 1).ok());
  ASSERT_TRUE((*client)->CreateTables(asp, 1).ok()) << "idempotent";

  std::vector<float> wv(10500, -1.f);
  std::vector<uint64_t> keys = {5, 1u << 29, 77, 5, 123456789};
  std::vector<float> rows(keys.size() * 16, -1.f);
  PullTargets targets{{{"fc/w", wv.data()}}, {{"emb", keys, rows.data()}}};
  ASSERT_TRUE((*client)->Pull(0, targets).ok());
  EXPECT_EQ(wv, InitialDense(w, 10500));
  EXPECT_EQ(rows, InitialRows(e, keys));

  std::vector<float> g(10500);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 7);
  std::vector<float> eg(keys.size() * 16, 1.f);
  PushSources sources{{{"fc/w", g.data()}}, {{"emb", keys, eg.data()}}};
  ASSERT_TRUE((*client)->Push(0, sources).ok());
  ASSERT_TRUE((*client)->Pull(1, targets).ok());
  auto w0 = InitialDense(w, 10500);
  for (size_t i = 0; i < wv.size(); ++i) ASSERT_FLOAT_EQ(wv[i], w0[i] - 0.5f * g[i]) << i;
  auto r0 = InitialRows(e, keys);
  for (size_t i = 0; i < rows.size(); ++i) {
    float times = keys[i / 16] == 5 ? 2.f : 1.f;  // Key 5 twice: its gradients add.
    ASSERT_FLOAT_EQ(rows[i], r0[i] - 0.5f * times) << i;
  }
  // PushPull: the reply reflects this push.
  ASSERT_TRUE((*client)->PushPull(1, sources, targets).ok());
  for (size_t i = 0; i < wv.size(); ++i) ASSERT_FLOAT_EQ(wv[i], w0[i] - 1.0f * g[i]) << i;

  auto statuses = (*client)->ServerStatuses();
  ASSERT_TRUE(statuses.ok());
  uint64_t blocks = 0;
  for (const auto& s : *statuses) {
    ASSERT_EQ(s.jobs_size(), 1);
    EXPECT_EQ(s.jobs(0).clocks(0).clock(), 2) << "every server saw both steps end";
    for (const auto& t : s.jobs(0).tables()) {
      if (t.name() == "fc/w") blocks += t.rows();
    }
  }
  EXPECT_EQ(blocks, 11u);
}

INSTANTIATE_TEST_SUITE_P(Servers, ServiceTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace pscluster
