// Compressed pushes (top-k and int8, with error feedback on the worker) and top-k both ways (pulls
// too, with error feedback on the servers) train the Fashion-MNIST MLP as well as dense float32:
// the same job (seed, data order, initial weights) is trained four times against two parameter
// servers in this process, and the test accuracies compared.
#include <gtest/gtest.h>

#include "common/clock.h"
#include "server/ps_server.h"
#include "worker/standalone.h"
#include "worker/trainer.h"

namespace pscluster::worker {
namespace {

class NullSink final : public ProgressSink {
 public:
  bool Report(const v1::WorkerProgress&) override { return true; }
  absl::StatusOr<v1::ShardMap> RefreshShardMap() override {
    return absl::UnavailableError("no scheduler in this test");
  }
};

class CompressedTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      auto s = PsServer::Start(PsServerOptions{}, &clock_);
      ASSERT_TRUE(s.ok()) << s.status();
      addresses_.push_back((*s)->address());
      servers_.push_back(std::move(*s));
    }
  }
  void TearDown() override {
    for (auto& s : servers_) s->Shutdown();
  }

  // One worker trains the MLP for four epochs; `compression` applies to every table ("*").
  // Returns its test accuracy.
  double Train(const std::string& job, const v1::CompressionSpec* compression) {
    v1::AssignTaskRequest t;
    t.set_job_id(job);
    t.set_rank(0);
    t.set_num_workers(1);
    v1::JobSpec* spec = t.mutable_spec();
    spec->set_name(job);
    spec->mutable_model()->set_kind("mlp");
    spec->mutable_model()->add_hidden(128);
    spec->mutable_dataset()->set_name("fashion_mnist");
    // Plain SGD, the setting of the error-feedback analyses (Stich et al. 2018, "Sparsified SGD
    // with memory"); with the servers' momentum or Adam, top-k 1% lags further (README).
    spec->mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
    spec->mutable_optimizer()->set_learning_rate(0.1f);
    spec->mutable_optimizer()->set_lr_schedule(v1::OptimizerSpec::COSINE);
    spec->mutable_consistency()->set_mode(v1::ConsistencySpec::BSP);
    spec->set_num_servers(2);
    spec->set_num_workers(1);
    spec->set_epochs(4);
    spec->set_batch_size(100);
    spec->set_seed(5);
    if (compression != nullptr) (*spec->mutable_table_compression())["*"] = *compression;
    *t.mutable_shard_map() = *RoundRobinShardMap(job, addresses_, 16);
    TrainerOptions o;
    o.device = "cpu";
    o.cpu_threads = 1;
    o.install_shard_map = true;
    o.call_timeout = absl::Seconds(60);
    NullSink sink;
    auto trainer = Trainer::Create(t, o, &sink);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    if (!trainer.ok()) return -1;
    absl::Status st = (*trainer)->Run();
    EXPECT_TRUE(st.ok()) << st;
    return (*trainer)->result().test_accuracy;
  }

  RealClock clock_;
  std::vector<std::unique_ptr<PsServer>> servers_;
  std::vector<std::string> addresses_;
};

TEST_F(CompressedTrainingTest, TopKAndInt8WithErrorFeedbackMatchDenseAccuracy) {
  const double dense = Train("dense", nullptr);
  v1::CompressionSpec topk;
  topk.set_topk_ratio(0.01f);
  const double sparse = Train("topk", &topk);
  v1::CompressionSpec int8;
  int8.set_quantize(v1::CompressionSpec::QUANTIZE_INT8);
  const double quantized = Train("int8", &int8);
  // Top-k both ways: the pulls too send only the 1% of each block that moved most since the
  // worker's copy (with plain SGD, a top-k push moves only what it sends, so the pull owes
  // nothing further and the worker's copy is exact).
  v1::CompressionSpec both = topk;
  both.set_pull_topk_ratio(0.01f);
  const double both_ways = Train("topk-both", &both);
  std::printf("test accuracy: float32 %.4f, top-k 1%% %.4f, int8 %.4f, top-k 1%% both ways %.4f\n",
              dense, sparse, quantized, both_ways);
  EXPECT_GT(dense, 0.85);
  EXPECT_GT(sparse, dense - 0.005);
  EXPECT_GT(quantized, dense - 0.005);
  EXPECT_GT(both_ways, dense - 0.005);
}

}  // namespace
}  // namespace pscluster::worker
