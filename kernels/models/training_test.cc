// The models learn: plain SGD over TrainStep's gradients in a single process, the way a
// one-process trainer would use the model API. Built for the CPU (training_cpu_test) and CUDA
// (training_cuda_test, tag gpu).
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
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

#ifndef KERNELS_TEST_DEVICE
#error "KERNELS_TEST_DEVICE must name the backend under test"
#endif

namespace pscluster::kernels {
namespace {

using testing::Spec;

struct Data {
  int64_t n = 0;
  int64_t dim = 0;
  std::vector<float> x;
  std::vector<int32_t> y;
};

class TrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendOptions options;
    options.cpu_threads = 2;
    auto backend = CreateBackend(KERNELS_TEST_DEVICE, options);
    if (!backend.ok()) {
      if (std::string(KERNELS_TEST_DEVICE) == "cuda") GTEST_SKIP() << backend.status();
      FAIL() << backend.status();
    }
    backend_ = std::move(*backend);
    seed_ = testing::FreshSeed();
    rng_.seed(seed_);
  }

  // Trains `model` with SGD for `epochs` over `train`; returns accuracy on `test`.
  // SGD at `lr`, the last epoch at `lr * last_epoch_scale` (a smaller step there settles the
  // weights, so the test accuracy does not depend on where the final steps happened to land).
  double TrainAndTest(Model& model, const Data& train, const Data& test, int epochs,
                      int64_t batch_size, float lr, double* first_loss, double* last_loss,
                      float last_epoch_scale = 1.f) {
    HostParams host(model);
    std::vector<int64_t> order(train.n);
    std::iota(order.begin(), order.end(), 0);
    std::vector<float> x(batch_size * train.dim);
    std::vector<int32_t> y(batch_size);
    double loss_sum = 0;
    int64_t loss_steps = 0;
    *first_loss = -1;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      std::shuffle(order.begin(), order.end(), rng_);
      for (int64_t start = 0; start + batch_size <= train.n; start += batch_size) {
        for (int64_t i = 0; i < batch_size; ++i) {
          const int64_t e = order[start + i];
          std::copy_n(train.x.begin() + e * train.dim, train.dim, x.begin() + i * train.dim);
          y[i] = train.y[e];
        }
        Batch batch;
        batch.num_examples = batch_size;
        batch.dense = x;
        batch.labels = y;
        auto values = host.Gather(*model.SparseKeys(batch));
        EXPECT_TRUE(values.ok()) << values.status();
        Gradients grads = host.GradientBuffers();
        StepResult r;
        absl::Status s = model.TrainStep(batch, *values, grads, &r);
        EXPECT_TRUE(s.ok()) << s;
        if (!s.ok()) return 0;
        if (*first_loss < 0) *first_loss = r.loss;
        loss_sum += r.loss;
        ++loss_steps;
        host.ApplySgd(grads, epoch + 1 == epochs ? lr * last_epoch_scale : lr);
      }
    }
    *last_loss = loss_sum / loss_steps;  // Mean over training, a smoothed "recent" loss below.
    // Evaluate in batches of 1000.
    int64_t correct = 0;
    double test_loss = 0;
    for (int64_t start = 0; start < test.n; start += 1000) {
      const int64_t m = std::min<int64_t>(1000, test.n - start);
      Batch batch;
      batch.num_examples = m;
      batch.dense = absl::MakeConstSpan(test.x.data() + start * test.dim, m * test.dim);
      batch.labels = absl::MakeConstSpan(test.y.data() + start, m);
      auto values = host.Gather(*model.SparseKeys(batch));
      StepResult r;
      EXPECT_TRUE(model.Evaluate(batch, *values, &r).ok());
      correct += r.correct;
      test_loss += r.loss * m;
    }
    *last_loss = test_loss / test.n;
    return static_cast<double>(correct) / test.n;
  }

  std::unique_ptr<Backend> backend_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

// 28x28 "images" of 10 classes: each class a random smooth template of blobs; examples are
// their template shifted by up to a pixel, scaled in brightness and covered in noise.
Data FashionShaped(std::mt19937_64& rng, const std::vector<std::vector<float>>& templates,
                   int64_t n) {
  Data d;
  d.n = n;
  d.dim = 784;
  d.x.resize(n * 784);
  std::normal_distribution<float> noise(0.0f, 0.35f);
  std::uniform_int_distribution<int> cls(0, 9), shift(-1, 1);
  std::uniform_real_distribution<float> gain(0.7f, 1.3f);
  for (int64_t i = 0; i < n; ++i) {
    const int c = cls(rng);
    d.y.push_back(c);
    const int dy = shift(rng), dx = shift(rng);
    const float g = gain(rng);
    for (int r = 0; r < 28; ++r) {
      for (int q = 0; q < 28; ++q) {
        const int sr = std::clamp(r + dy, 0, 27), sq = std::clamp(q + dx, 0, 27);
        d.x[i * 784 + r * 28 + q] = g * templates[c][sr * 28 + sq] + noise(rng);
      }
    }
  }
  return d;
}

std::vector<std::vector<float>> Templates(std::mt19937_64& rng) {
  std::vector<std::vector<float>> t(10, std::vector<float>(784, 0.0f));
  std::uniform_real_distribution<float> pos(4.0f, 24.0f), amp(-1.0f, 1.5f);
  for (auto& img : t) {
    for (int blob = 0; blob < 6; ++blob) {
      const float cr = pos(rng), cq = pos(rng), a = amp(rng);
      for (int r = 0; r < 28; ++r) {
        for (int q = 0; q < 28; ++q) {
          img[r * 28 + q] += a * std::exp(-((r - cr) * (r - cr) + (q - cq) * (q - cq)) / 18.0f);
        }
      }
    }
  }
  return t;
}

TEST_F(TrainingTest, MlpLearnsFashionMnistShapedData) {
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  const auto templates = Templates(rng_);
  const Data train = FashionShaped(rng_, templates, 6000);
  const Data test = FashionShaped(rng_, templates, 2000);
  auto model = CreateModel(Spec("mlp", 784, 10, {64}), backend_.get());
  ASSERT_TRUE(model.ok()) << model.status();
  double first = 0, last = 0;
  const double accuracy = TrainAndTest(**model, train, test, 2, 64, 0.05f, &first, &last);
  EXPECT_NEAR(first, std::log(10.0), 1.5);  // Starts near chance.
  EXPECT_LT(last, 0.5 * first);
  EXPECT_GT(accuracy, 0.9) << "held-out accuracy (chance is 0.1)";
}

TEST_F(TrainingTest, CnnLearnsFashionMnistShapedData) {
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  const auto templates = Templates(rng_);
  const Data train = FashionShaped(rng_, templates, 3000);
  const Data test = FashionShaped(rng_, templates, 1000);
  auto model = CreateModel(Spec("cnn", 784, 10, {32}, "relu", 0, {4, 8}), backend_.get());
  ASSERT_TRUE(model.ok()) << model.status();
  double first = 0, last = 0;
  const double accuracy = TrainAndTest(**model, train, test, 1, 32, 0.05f, &first, &last);
  EXPECT_LT(last, 0.5 * first);
  EXPECT_GT(accuracy, 0.9) << "held-out accuracy (chance is 0.1)";
}

// Spam-like: a hashed bag of words where a few "spammy" keys decide the class.
TEST_F(TrainingTest, SparseModelsLearnWhichFeaturesMatter) {
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  std::uniform_int_distribution<uint64_t> common(0, 1 << 20), spammy(0, 49), hammy(50, 99);
  std::uniform_int_distribution<int> coin(0, 1), len(5, 30);
  auto make = [&](int64_t n, std::vector<uint64_t>* offsets, std::vector<uint64_t>* keys,
                  std::vector<float>* values, std::vector<int32_t>* labels) {
    offsets->assign(1, 0);
    for (int64_t i = 0; i < n; ++i) {
      const int label = coin(rng_);
      labels->push_back(label);
      const int l = len(rng_);
      for (int j = 0; j < l; ++j) keys->push_back(common(rng_) * 1000003ull);  // Noise words.
      for (int j = 0; j < 3; ++j) keys->push_back(label ? spammy(rng_) : hammy(rng_));
      values->resize(keys->size(), 1.0f / std::sqrt(static_cast<float>(l + 3)));
      offsets->push_back(keys->size());
    }
  };
  std::vector<uint64_t> offsets, keys, test_offsets, test_keys;
  std::vector<float> values, test_values;
  std::vector<int32_t> labels, test_labels;
  make(4000, &offsets, &keys, &values, &labels);
  make(1000, &test_offsets, &test_keys, &test_values, &test_labels);
  for (const v1::ModelSpec& spec :
       {Spec("sparse_linear", 0, 2), Spec("sparse_linear", 0, 2, {16}, "relu", 8)}) {
    SCOPED_TRACE(spec.ShortDebugString());
    auto model = CreateModel(spec, backend_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    HostParams host(**model);
    const int64_t bs = 50;
    for (int epoch = 0; epoch < 8; ++epoch) {
      for (int64_t start = 0; start < 4000; start += bs) {
        Batch b;
        b.num_examples = bs;
        b.offsets = absl::MakeConstSpan(offsets.data() + start, bs + 1);
        b.keys = keys;
        b.values = values;
        b.labels = absl::MakeConstSpan(labels.data() + start, bs);
        auto values_now = host.Gather(*(*model)->SparseKeys(b));
        ASSERT_TRUE(values_now.ok());
        Gradients g = host.GradientBuffers();
        StepResult r;
        ASSERT_TRUE((*model)->TrainStep(b, *values_now, g, &r).ok());
        host.ApplySgd(g, 0.5f);
      }
    }
    Batch t;
    t.num_examples = 1000;
    t.offsets = test_offsets;
    t.keys = test_keys;
    t.values = test_values;
    t.labels = test_labels;
    auto v = host.Gather(*(*model)->SparseKeys(t));
    StepResult r;
    ASSERT_TRUE((*model)->Evaluate(t, *v, &r).ok());
    EXPECT_GT(r.correct, 950) << "held-out accuracy of 1000 (chance is 500), loss " << r.loss;
  }
}

// Real Fashion-MNIST, when Debian's dataset-fashion-mnist is installed: the MLP reaches the
// published logistic-regression level (0.84) within two epochs of plain SGD.
bool ReadIdx(const std::string& path, std::vector<uint8_t>* data, std::vector<uint32_t>* dims) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  uint8_t header[4];
  bool ok = gzread(f, header, 4) == 4 && header[0] == 0 && header[1] == 0 && header[2] == 8;
  const int rank = ok ? header[3] : 0;
  size_t total = 1;
  for (int i = 0; ok && i < rank; ++i) {
    uint8_t b[4];
    ok = gzread(f, b, 4) == 4;
    dims->push_back(uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | b[3]);
    total *= dims->back();
  }
  if (ok) {
    data->resize(total);
    ok = gzread(f, data->data(), total) == static_cast<int>(total);
  }
  gzclose(f);
  return ok;
}

bool LoadSplit(const std::string& prefix, Data* d) {
  std::vector<uint8_t> images, labels;
  std::vector<uint32_t> image_dims, label_dims;
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  if (!ReadIdx(dir + prefix + "-images-idx3-ubyte.gz", &images, &image_dims) ||
      !ReadIdx(dir + prefix + "-labels-idx1-ubyte.gz", &labels, &label_dims)) {
    return false;
  }
  d->n = labels.size();
  d->dim = 784;
  d->x.resize(images.size());
  // The training set's mean 0.2860 and standard deviation 0.3530 of pixels in [0, 1].
  for (size_t i = 0; i < images.size(); ++i) d->x[i] = (images[i] / 255.0f - 0.2860f) / 0.3530f;
  d->y.assign(labels.begin(), labels.end());
  return d->n * 784 == static_cast<int64_t>(images.size());
}

TEST_F(TrainingTest, MlpLearnsRealFashionMnist) {
  Data train, test;
  if (!LoadSplit("train", &train) || !LoadSplit("t10k", &test)) {
    GTEST_SKIP() << "Fashion-MNIST not found in /usr/share/datasets/fashion-mnist (install the "
                    "Debian package dataset-fashion-mnist)";
  }
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  auto model = CreateModel(Spec("mlp", 784, 10, {128}), backend_.get());
  ASSERT_TRUE(model.ok()) << model.status();
  double first = 0, last = 0;
  const double accuracy =
      TrainAndTest(**model, train, test, 2, 64, 0.05f, &first, &last, /*last_epoch_scale=*/0.2f);
  RecordProperty("test_accuracy", std::to_string(accuracy));
  std::printf("Fashion-MNIST MLP [128], 2 epochs SGD (the second at lr / 5): test accuracy %.4f, test loss %.4f\n",
              accuracy, last);
  EXPECT_GT(accuracy, 0.84);
}

}  // namespace
}  // namespace pscluster::kernels
