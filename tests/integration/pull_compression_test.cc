// Pull compression (CompressionSpec.pull_topk_ratio) end to end: PsClient against two in-process
// servers, over each data transport. A worker's pulls of a table with pull compression send only
// what moved most since its last pull; what the worker holds is then what the servers keep as
// its view; what a pull does not send, later pulls do, so once the weights stop moving the
// worker holds them exactly; a new task of the rank, or a task whose view the server no longer
// has, gets whole blocks again. A reference client (the same table without pull compression in
// its own spec, so its pulls are plain) reads the servers' weights.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/testing/cluster.h"
#include "server/testing/test_tables.h"

namespace pscluster::testing {
namespace {

constexpr uint64_t kElems = 100000;  // 13 blocks of 8192 over two servers.
constexpr float kRatio = 0.05f;

struct Param {
  DataTransport transport;
  v1::DataType dtype;
  const char* name;
};

class PullCompressionTest : public ::testing::TestWithParam<Param> {
 protected:
  v1::TableSpec Table(bool compressed) const {
    v1::TableSpec t = DenseSpec("w", {kElems}, Optimizer(v1::OptimizerSpec::SGD, 0.1f), 8192);
    t.mutable_compression()->set_transport(GetParam().dtype);
    if (compressed) t.mutable_compression()->set_pull_topk_ratio(kRatio);
    return t;
  }
  std::unique_ptr<PsClient> Client(bool compressed, bool create) {
    PsClientOptions o;
    o.data_transport = GetParam().transport;
    auto c = cluster_.Client("job", {Table(compressed)}, 0, o);
    if (!c.ok()) {
      ADD_FAILURE() << c.status();
      return nullptr;
    }
    if (create) {
      v1::ConsistencySpec asp;
      asp.set_mode(v1::ConsistencySpec::ASP);
      absl::Status st = (*c)->CreateTables(asp, 1);
      if (!st.ok()) {
        ADD_FAILURE() << st;
        return nullptr;
      }
    }
    return std::move(*c);
  }
  // The servers' weights, as a plain pull in the table's transport gives them.
  std::vector<float> ServersHold(PsClient& plain) {
    std::vector<float> w(kElems);
    absl::Status st = plain.Pull(0, {{{"w", w.data()}}, {}});
    EXPECT_TRUE(st.ok()) << st;
    return w;
  }
  uint64_t BytesOut() {
    uint64_t total = 0;
    for (int i = 0; i < 2; ++i) {
      v1::ServerStatus st;
      EXPECT_TRUE(cluster_.server(i)->handler()->Status(v1::ServerStatusRequest(), &st).ok());
      total += st.bytes_out_total();
    }
    return total;
  }

  InProcessCluster cluster_{2};
};

TEST_P(PullCompressionTest, AWorkerHoldsWhatItWasSentAndCatchesUpOnceTheWeightsStop) {
  ASSERT_TRUE(cluster_.status().ok()) << cluster_.status();
  auto worker = Client(/*compressed=*/true, /*create=*/true);
  auto plain = Client(/*compressed=*/false, /*create=*/false);
  ASSERT_TRUE(worker != nullptr && plain != nullptr);
  std::vector<float> held(kElems);
  // The first pull is whole.
  ASSERT_TRUE(worker->Pull(0, {{{"w", held.data()}}, {}}).ok());
  EXPECT_EQ(held, ServersHold(*plain));

  // Ten steps of push-pull: each pull sends 5% of each block.
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  std::vector<float> grad(kElems);
  uint64_t compressed_bytes = 0;
  for (int64_t step = 0; step < 10; ++step) {
    for (float& g : grad) g = d(rng);
    const uint64_t before = BytesOut();
    absl::Status st = worker->PushPull(step, {{{"w", grad.data()}}, {}}, {{{"w", held.data()}}, {}});
    ASSERT_TRUE(st.ok()) << st;
    compressed_bytes += BytesOut() - before;
  }
  const std::vector<float> now = ServersHold(*plain);
  double owed = 0;
  for (uint64_t i = 0; i < kElems; ++i) owed += std::fabs(now[i] - held[i]);
  EXPECT_GT(owed, 0) << "most of each step's change is still owed to the worker";
  // An exact pull (evaluation, export) reads the servers' weights and leaves the copy alone.
  std::vector<float> exact(kElems);
  PullTargets exact_targets{{{"w", exact.data()}}, {}};
  exact_targets.exact = true;
  ASSERT_TRUE(worker->Pull(10, exact_targets).ok());
  EXPECT_EQ(exact, now);
  // What ten whole pulls of the same table cost, for comparison.
  const uint64_t before_plain = BytesOut();
  for (int i = 0; i < 10; ++i) (void)ServersHold(*plain);
  const uint64_t plain_bytes = BytesOut() - before_plain;
  EXPECT_LT(compressed_bytes, plain_bytes * 0.2)
      << compressed_bytes << " bytes compressed against " << plain_bytes << " whole";

  // The weights stand still: within 1 / ratio pulls every owed element has been sent, and the
  // worker holds exactly what the servers hold.
  const uint64_t before_catch_up = BytesOut();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(worker->Pull(10, {{{"w", held.data()}}, {}}).ok());
  EXPECT_EQ(held, now);
  EXPECT_LT(BytesOut() - before_catch_up, plain_bytes * 0.4)
      << "20 pulls of 5% each: its views were kept through the exact pull";

  // A new task of the rank starts with nothing held: whole blocks, right at once. The first
  // task's views are gone with it; should it pull again, it is sent whole blocks too.
  auto second = Client(/*compressed=*/true, /*create=*/false);
  ASSERT_NE(second, nullptr);
  std::vector<float> fresh(kElems);
  ASSERT_TRUE(second->Pull(10, {{{"w", fresh.data()}}, {}}).ok());
  EXPECT_EQ(fresh, now);
  for (float& g : grad) g = d(rng);
  ASSERT_TRUE(second->Push(10, {{{"w", grad.data()}}, {}}).ok());
  ASSERT_TRUE(worker->Pull(11, {{{"w", held.data()}}, {}}).ok());
  EXPECT_EQ(held, ServersHold(*plain)) << "the first task's view was replaced: a whole pull";
}

INSTANTIATE_TEST_SUITE_P(
    Transports, PullCompressionTest,
    ::testing::Values(Param{DataTransport::kTcp, v1::DT_FLOAT32, "TcpFloat32"},
                      Param{DataTransport::kGrpc, v1::DT_FLOAT32, "GrpcFloat32"},
                      Param{DataTransport::kUnix, v1::DT_FLOAT16, "UnixFloat16"}),
    [](const ::testing::TestParamInfo<Param>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace pscluster::testing
