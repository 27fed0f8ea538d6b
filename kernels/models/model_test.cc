// Model construction, parameter tables, input validation and step mechanics (CPU backend).
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/host_init.h"
#include "kernels/models/model_test_util.h"
#include "kernels/testing/test_util.h"

namespace pscluster::kernels {
namespace {

using testing::OwnedBatch;
using testing::OwnedParams;
using testing::Spec;
using v1::InitializerSpec;

class ModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendOptions options;
    options.cpu_threads = 2;
    auto backend = CreateBackend("cpu", options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    seed_ = testing::FreshSeed();
    rng_.seed(seed_);
  }
  std::unique_ptr<Model> Make(const v1::ModelSpec& spec, ModelOptions options = ModelOptions()) {
    auto m = CreateModel(spec, backend_.get(), options);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }
  std::string Seed() const { return absl::StrCat("seed ", seed_); }

  std::unique_ptr<Backend> backend_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

#define EXPECT_INVALID(expr, needle)                                                  \
  do {                                                                                \
    absl::Status s_ = (expr);                                                         \
    EXPECT_EQ(s_.code(), absl::StatusCode::kInvalidArgument) << s_;                   \
    EXPECT_NE(std::string(s_.message()).find(needle), std::string::npos) << s_;       \
  } while (0)

TEST_F(ModelTest, MlpParametersMapToTables) {
  ModelOptions options;
  options.seed = 77;
  auto m = Make(Spec("mlp", 784, 10, {256, 128}), options);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->kind(), "mlp");
  EXPECT_EQ(m->input_kind(), InputKind::kDense);
  EXPECT_EQ(m->input_dim(), 784);
  EXPECT_EQ(m->num_classes(), 10);
  const auto& p = m->params();
  ASSERT_EQ(p.size(), 6u);
  const std::vector<std::string> names = {"fc1/weight", "fc1/bias",   "fc2/weight",
                                          "fc2/bias",   "out/weight", "out/bias"};
  const std::vector<std::vector<int64_t>> shapes = {{784, 256}, {256}, {256, 128},
                                                    {128},      {128, 10}, {10}};
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].name, names[i]);
    EXPECT_FALSE(p[i].sparse);
    EXPECT_EQ(p[i].shape, shapes[i]);
    EXPECT_EQ(p[i].init.seed(), 77u);
  }
  // Hidden layers: He normal; output: Glorot uniform; biases zero.
  EXPECT_EQ(p[0].init_rule, InitializerSpec::HE_NORMAL);
  EXPECT_EQ(p[0].init.kind(), InitializerSpec::NORMAL);
  EXPECT_FLOAT_EQ(p[0].init.stddev(), std::sqrt(2.0f / 784));
  EXPECT_EQ(p[0].fan_in, 784);
  EXPECT_EQ(p[1].init.kind(), InitializerSpec::ZEROS);
  EXPECT_EQ(p[4].init_rule, InitializerSpec::GLOROT_UNIFORM);
  EXPECT_EQ(p[4].init.kind(), InitializerSpec::UNIFORM);
  EXPECT_FLOAT_EQ(p[4].init.high(), std::sqrt(6.0f / 138));
  EXPECT_FLOAT_EQ(p[4].init.low(), -std::sqrt(6.0f / 138));
}

TEST_F(ModelTest, SoftmaxCnnAndSparseParameters) {
  auto softmax = Make(Spec("softmax", 784, 10));
  ASSERT_NE(softmax, nullptr);
  ASSERT_EQ(softmax->params().size(), 2u);
  EXPECT_EQ(softmax->params()[0].name, "linear/weight");
  EXPECT_EQ(softmax->params()[0].shape, (std::vector<int64_t>{784, 10}));

  auto cnn = Make(Spec("cnn", 784, 10));
  ASSERT_NE(cnn, nullptr);
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"conv1/weight", {16, 5, 5, 1}}, {"conv1/bias", {16}}, {"conv2/weight", {32, 5, 5, 16}},
      {"conv2/bias", {32}},           {"fc1/weight", {7 * 7 * 32, 128}}, {"fc1/bias", {128}},
      {"out/weight", {128, 10}},      {"out/bias", {10}}};
  ASSERT_EQ(cnn->params().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(cnn->params()[i].name, want[i].first);
    EXPECT_EQ(cnn->params()[i].shape, want[i].second);
  }
  EXPECT_EQ(cnn->params()[2].fan_in, 5 * 5 * 16);
  auto cnn_custom = Make(Spec("cnn", 784, 10, {64}, "gelu", 0, {8, 12}));
  ASSERT_NE(cnn_custom, nullptr);
  EXPECT_EQ(cnn_custom->params()[4].shape, (std::vector<int64_t>{7 * 7 * 12, 64}));

  auto linear = Make(Spec("sparse_linear", 1 << 20, 2));
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(linear->input_kind(), InputKind::kSparse);
  ASSERT_EQ(linear->params().size(), 2u);
  EXPECT_EQ(linear->params()[0].name, "sparse/weight");
  EXPECT_TRUE(linear->params()[0].sparse);
  EXPECT_EQ(linear->params()[0].row_width, 2);
  EXPECT_EQ(linear->params()[0].key_space, uint64_t{1} << 20);
  EXPECT_EQ(linear->params()[0].init.kind(), InitializerSpec::ZEROS);
  EXPECT_EQ(linear->params()[1].shape, (std::vector<int64_t>{2}));

  auto emb = Make(Spec("sparse_linear", 0, 2, {32}, "relu", 16));
  ASSERT_NE(emb, nullptr);
  ASSERT_EQ(emb->params().size(), 6u);
  EXPECT_EQ(emb->params()[0].name, "embedding/weight");
  EXPECT_EQ(emb->params()[0].row_width, 16);
  EXPECT_EQ(emb->params()[0].key_space, 0u);
  EXPECT_EQ(emb->params()[0].init.kind(), InitializerSpec::NORMAL);
  EXPECT_FLOAT_EQ(emb->params()[0].init.stddev(), 0.25f);
  EXPECT_EQ(emb->params()[2].name, "fc1/weight");
  EXPECT_EQ(emb->params()[2].shape, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(emb->params()[4].name, "out/weight");
}

TEST_F(ModelTest, BadSpecsAreInvalidArgumentNamingTheField) {
  struct Bad {
    v1::ModelSpec spec;
    std::string field;
  };
  const Bad bad[] = {
      {Spec("transformer", 784, 10), "model.kind"},
      {Spec("mlp", 784, 10, {}), "model.hidden"},
      {Spec("mlp", 784, 10, {0}), "model.hidden[0]"},
      {Spec("mlp", 0, 10, {32}), "model.input_dim"},
      {Spec("mlp", 784, 1, {32}), "model.num_classes"},
      {Spec("mlp", 784, 0, {32}), "model.num_classes"},
      {Spec("mlp", 784, 10, {32}, "tanh"), "model.activation"},
      {Spec("softmax", 784, 10, {32}), "model.hidden"},
      {Spec("cnn", 700, 10), "model.input_dim"},
      {Spec("cnn", 784, 10, {}, "", 0, {8}), "model.conv_channels"},
      {Spec("cnn", 784, 10, {}, "", 0, {8, 0}), "model.conv_channels[1]"},
      {Spec("cnn", 784, 10, {32, 32}), "model.hidden"},
      {Spec("mlp", 784, 10, {32}, "", 0, {8, 8}), "model.conv_channels"},
      {Spec("mlp", 784, 10, {32}, "", 16), "model.embedding_dim"},
      {Spec("sparse_linear", 100, 2, {32}), "model.hidden"},
      {Spec("mlp", 1 << 20, 10, {1 << 20}), "fc1/weight"},
  };
  for (const Bad& b : bad) {
    auto m = CreateModel(b.spec, backend_.get());
    ASSERT_FALSE(m.ok()) << b.spec.ShortDebugString();
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
    EXPECT_NE(std::string(m.status().message()).find(b.field), std::string::npos)
        << m.status() << " should name " << b.field;
  }
  EXPECT_EQ(CreateModel(Spec("mlp", 10, 2, {4}), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelTest, BadDenseStepsAreInvalidArgumentAndChangeNothing) {
  SCOPED_TRACE(Seed());
  auto m = Make(Spec("mlp", 6, 3, {4}));
  ASSERT_NE(m, nullptr);
  OwnedBatch good = testing::RandomDenseBatch(rng_, 4, 6, 3);
  OwnedParams params(*m, *m->SparseKeys(good.view()), rng_, 0.3f);
  StepResult r;
  ASSERT_TRUE(m->TrainStep(good.view(), params.view(), params.grad_view(), &r).ok());
  const auto grads_before = params.grads;

  OwnedBatch b = good;
  b.labels[2] = 3;
  EXPECT_INVALID(m->TrainStep(b.view(), params.view(), params.grad_view(), &r), "batch.labels[2]");
  b.labels[2] = -1;
  EXPECT_INVALID(m->Evaluate(b.view(), params.view(), &r), "batch.labels[2]");
  b = good;
  b.dense.pop_back();
  EXPECT_INVALID(m->TrainStep(b.view(), params.view(), params.grad_view(), &r), "batch.dense");
  b = good;
  b.labels.pop_back();
  Batch short_labels = b.view();
  short_labels.num_examples = 4;
  EXPECT_INVALID(m->TrainStep(short_labels, params.view(), params.grad_view(), &r),
                 "batch.labels has 3 entries");
  Batch empty = good.view();
  empty.num_examples = 0;
  empty.labels = {};
  empty.dense = {};
  EXPECT_INVALID(m->TrainStep(empty, params.view(), params.grad_view(), &r), "num_examples");

  ParamValues missing = params.view();
  missing.values.pop_back();
  EXPECT_INVALID(m->TrainStep(good.view(), missing, params.grad_view(), &r), "params.values");
  ParamValues short_values = params.view();
  short_values.values[2] = short_values.values[2].subspan(1);
  EXPECT_INVALID(m->TrainStep(good.view(), short_values, params.grad_view(), &r),
                 "params.values[2] (out/weight)");
  Gradients short_grads = params.grad_view();
  short_grads.values[1] = short_grads.values[1].subspan(0, 1);
  EXPECT_INVALID(m->TrainStep(good.view(), params.view(), short_grads, &r),
                 "grads.values[1] (fc1/bias)");
  EXPECT_EQ(params.grads, grads_before);

  // Still works afterwards, with the same result.
  StepResult again;
  ASSERT_TRUE(m->TrainStep(good.view(), params.view(), params.grad_view(), &again).ok());
  EXPECT_EQ(again.loss, r.loss);
  EXPECT_EQ(params.grads, grads_before);
}

TEST_F(ModelTest, BadSparseStepsAreInvalidArgument) {
  SCOPED_TRACE(Seed());
  auto m = Make(Spec("sparse_linear", 1000, 2));
  ASSERT_NE(m, nullptr);
  OwnedBatch good = testing::RandomSparseBatch(rng_, 8, 1000, 5, 2);
  auto keys = m->SparseKeys(good.view());
  ASSERT_TRUE(keys.ok());
  OwnedParams params(*m, *keys, rng_, 0.3f);
  StepResult r;
  ASSERT_TRUE(m->TrainStep(good.view(), params.view(), params.grad_view(), &r).ok());

  OwnedBatch b = good;
  b.offsets.pop_back();
  EXPECT_INVALID(m->TrainStep(b.view(), params.view(), params.grad_view(), &r), "batch.offsets");
  b = good;
  std::swap(b.offsets[3], b.offsets[4]);
  if (b.offsets[3] != b.offsets[4]) {
    EXPECT_INVALID(m->TrainStep(b.view(), params.view(), params.grad_view(), &r),
                   "batch.offsets decreases");
  }
  b = good;
  b.offsets.back() = b.keys.size() + 1;
  EXPECT_INVALID(m->SparseKeys(b.view()).status(), "exceeds");
  b = good;
  b.values.pop_back();
  EXPECT_INVALID(m->TrainStep(b.view(), params.view(), params.grad_view(), &r), "batch.values");
  b = good;
  b.keys[0] = 1000;
  EXPECT_INVALID(m->SparseKeys(b.view()).status(), "key space");
  b = good;
  b.keys[0] = 5000;  // Not among the supplied keys (and outside the key space).
  EXPECT_INVALID(m->TrainStep(b.view(), params.view(), params.grad_view(), &r), "batch.keys[0]");

  // Keys that do not cover the batch, or are not sorted.
  OwnedParams fewer = params;
  fewer.keys[0].pop_back();
  fewer.values[0].resize(fewer.keys[0].size() * 2);
  fewer.grads[0].resize(fewer.keys[0].size() * 2);
  EXPECT_INVALID(m->TrainStep(good.view(), fewer.view(), fewer.grad_view(), &r), "lacks key");
  OwnedParams unsorted = params;
  std::swap(unsorted.keys[0][0], unsorted.keys[0][1]);
  EXPECT_INVALID(m->TrainStep(good.view(), unsorted.view(), unsorted.grad_view(), &r),
                 "strictly increasing");
}

// The sparse linear model against a float64 computation of the same logistic regression: rows
// the batch does not touch get zero gradients, and repeated keys add up.
TEST_F(ModelTest, SparseLinearMatchesFloat64ReferenceAndTouchesOnlyItsRows) {
  SCOPED_TRACE(Seed());
  const int classes = 3;
  auto m = Make(Spec("sparse_linear", 0, classes));
  ASSERT_NE(m, nullptr);
  OwnedBatch batch = testing::RandomSparseBatch(rng_, 20, 30, 8, classes);  // Many repeats.
  batch.keys[1] = batch.keys[0];  // A key twice in one example.
  auto keys = m->SparseKeys(batch.view());
  ASSERT_TRUE(keys.ok());
  std::vector<uint64_t>& k = (*keys)[0];
  ASSERT_TRUE(std::is_sorted(k.begin(), k.end()));
  ASSERT_EQ(std::adjacent_find(k.begin(), k.end()), k.end());
  // A superset: two keys the batch never uses (the batch's keys are all below 30).
  k.push_back(1000000);
  k.push_back(2000000);
  OwnedParams params(*m, *keys, rng_, 0.5f);
  StepResult r;
  ASSERT_TRUE(m->TrainStep(batch.view(), params.view(), params.grad_view(), &r).ok());

  const int64_t n = batch.labels.size();
  std::vector<double> grad(params.values[0].size(), 0.0), grad_bias(classes, 0.0);
  double loss = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> z(classes);
    for (int c = 0; c < classes; ++c) z[c] = params.values[1][c];
    for (uint64_t j = batch.offsets[i]; j < batch.offsets[i + 1]; ++j) {
      const size_t row = std::lower_bound(k.begin(), k.end(), batch.keys[j]) - k.begin();
      for (int c = 0; c < classes; ++c) z[c] += batch.values[j] * params.values[0][row * classes + c];
    }
    const double mx = *std::max_element(z.begin(), z.end());
    double sum = 0;
    for (double v : z) sum += std::exp(v - mx);
    loss += std::log(sum) + mx - z[batch.labels[i]];
    for (int c = 0; c < classes; ++c) {
      const double d = (std::exp(z[c] - mx) / sum - (c == batch.labels[i])) / n;
      grad_bias[c] += d;
      for (uint64_t j = batch.offsets[i]; j < batch.offsets[i + 1]; ++j) {
        const size_t row = std::lower_bound(k.begin(), k.end(), batch.keys[j]) - k.begin();
        grad[row * classes + c] += batch.values[j] * d;
      }
    }
  }
  EXPECT_NEAR(r.loss, loss / n, 1e-5);
  for (size_t i = 0; i < grad.size(); ++i) EXPECT_NEAR(params.grads[0][i], grad[i], 1e-5) << i;
  for (int c = 0; c < classes; ++c) EXPECT_NEAR(params.grads[1][c], grad_bias[c], 1e-5);
  // The untouched rows (the last two keys) have exactly zero gradient.
  for (int c = 0; c < classes; ++c) {
    EXPECT_EQ(params.grads[0][(k.size() - 2) * classes + c], 0.0f);
    EXPECT_EQ(params.grads[0][(k.size() - 1) * classes + c], 0.0f);
  }
}

// Device buffers grow and are reused across batch sizes without changing any result.
TEST_F(ModelTest, BatchSizeMayChangeBetweenSteps) {
  SCOPED_TRACE(Seed());
  for (const v1::ModelSpec& spec : {Spec("mlp", 20, 4, {16}), Spec("cnn", 64, 4, {8}, "relu", 0, {2, 3}),
                                    Spec("sparse_linear", 0, 3, {4}, "gelu", 6)}) {
    auto reused = Make(spec);
    ASSERT_NE(reused, nullptr);
    for (int64_t n : {3, 150, 1, 40}) {
      SCOPED_TRACE(absl::StrCat(spec.kind(), " n=", n));
      OwnedBatch batch = reused->input_kind() == InputKind::kDense
                             ? testing::RandomDenseBatch(rng_, n, reused->input_dim(), 4)
                             : testing::RandomSparseBatch(rng_, n, 50, 5, 3);
      auto keys = reused->SparseKeys(batch.view());
      ASSERT_TRUE(keys.ok());
      OwnedParams a(*reused, *keys, rng_, 0.3f);
      OwnedParams b = a;
      auto fresh = Make(spec);
      StepResult ra, rb;
      ASSERT_TRUE(reused->TrainStep(batch.view(), a.view(), a.grad_view(), &ra).ok());
      ASSERT_TRUE(fresh->TrainStep(batch.view(), b.view(), b.grad_view(), &rb).ok());
      EXPECT_EQ(ra.loss, rb.loss);
      EXPECT_EQ(ra.correct, rb.correct);
      EXPECT_EQ(a.grads, b.grads);
      StepResult eval;
      ASSERT_TRUE(reused->Evaluate(batch.view(), a.view(), &eval).ok());
      EXPECT_EQ(eval.loss, ra.loss);
      EXPECT_EQ(eval.correct, ra.correct);
      EXPECT_EQ(eval.examples, n);
    }
  }
}

TEST_F(ModelTest, ConvChunksGiveTheSameResultAsWholeBatches) {
  SCOPED_TRACE(Seed());
  ModelOptions tiny;
  tiny.conv_chunk_bytes = 1;  // One image at a time.
  auto chunked = Make(Spec("cnn", 784, 10, {16}, "relu", 0, {4, 6}), tiny);
  ModelOptions huge;
  huge.conv_chunk_bytes = size_t{1} << 30;
  auto whole = Make(Spec("cnn", 784, 10, {16}, "relu", 0, {4, 6}), huge);
  OwnedBatch batch = testing::RandomDenseBatch(rng_, 9, 784, 10);
  OwnedParams a(*chunked, *chunked->SparseKeys(batch.view()), rng_, 0.2f);
  OwnedParams b = a;
  StepResult ra, rb;
  ASSERT_TRUE(chunked->TrainStep(batch.view(), a.view(), a.grad_view(), &ra).ok());
  ASSERT_TRUE(whole->TrainStep(batch.view(), b.view(), b.grad_view(), &rb).ok());
  EXPECT_NEAR(ra.loss, rb.loss, 1e-5 * rb.loss);
  for (size_t i = 0; i < a.grads.size(); ++i) {
    for (size_t j = 0; j < a.grads[i].size(); ++j) {
      ASSERT_NEAR(a.grads[i][j], b.grads[i][j], 1e-5 + 1e-4 * std::fabs(b.grads[i][j]))
          << chunked->params()[i].name << "[" << j << "]";
    }
  }
}

TEST_F(ModelTest, HostInitFollowsTheInitializer) {
  auto m = Make(Spec("sparse_linear", 0, 3, {64}, "relu", 32));
  ASSERT_NE(m, nullptr);
  const ParamInfo& fc = m->params()[2];  // fc1/weight [32, 64], He normal.
  std::vector<float> v(fc.num_elements()), again(fc.num_elements());
  ASSERT_TRUE(InitializeDense(fc, absl::MakeSpan(v)).ok());
  ASSERT_TRUE(InitializeDense(fc, absl::MakeSpan(again)).ok());
  EXPECT_EQ(v, again);  // Deterministic.
  double mean = 0, sq = 0;
  for (float x : v) mean += x;
  mean /= v.size();
  for (float x : v) sq += (x - mean) * (x - mean);
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(sq / v.size()), fc.init.stddev(), 0.1 * fc.init.stddev());
  const ParamInfo& emb = m->params()[0];
  std::vector<uint64_t> keys = {5, 1ull << 60};
  std::vector<float> rows(2 * emb.row_width), one(emb.row_width);
  ASSERT_TRUE(InitializeRows(emb, keys, absl::MakeSpan(rows)).ok());
  ASSERT_TRUE(InitializeRows(emb, {keys[1]}, absl::MakeSpan(one)).ok());
  // A row depends on its key only, not on what else is initialised with it.
  EXPECT_EQ(std::vector<float>(rows.begin() + emb.row_width, rows.end()), one);
  EXPECT_FALSE(InitializeRows(emb, keys, absl::MakeSpan(one)).ok());
}

}  // namespace
}  // namespace pscluster::kernels
