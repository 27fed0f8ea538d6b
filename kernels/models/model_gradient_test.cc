// Finite-difference checks of every model's backward pass: the gradients TrainStep returns
// against central differences of the loss Evaluate computes. Smooth models (GELU, softmax,
// sparse linear) are checked coordinate by coordinate; ReLU models along random directions
// through all parameters at once, where the few ReLU kinks a perturbation crosses weigh little.
// Built for the CPU (model_gradient_cpu_test) and CUDA (model_gradient_cuda_test, tag gpu).
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/model_test_util.h"
#include "kernels/testing/test_util.h"

#ifndef KERNELS_TEST_DEVICE
#error "KERNELS_TEST_DEVICE must name the backend under test"
#endif

namespace pscluster::kernels {
namespace {

using testing::OwnedBatch;
using testing::OwnedParams;
using testing::Spec;

struct Case {
  std::string name;
  v1::ModelSpec spec;
  bool smooth;  // No ReLU: check single coordinates.
  float scale = 0.5f;  // Standard deviation of the random parameter values.
  // Graphs over fields: the batch's dense features and fields (else RandomDenseBatch or
  // RandomSparseBatch by the model's input kind).
  int dense = 0;
  int fields = 0;
};

constexpr uint64_t kFieldSize = 7;  // Small, so that keys repeat within a batch.

std::vector<Case> Cases() {
  return {
      {"softmax", Spec("softmax", 12, 4), true},
      {"mlp_gelu", Spec("mlp", 10, 5, {8, 6}, "gelu"), true},
      {"mlp_relu", Spec("mlp", 10, 5, {16, 12}, "relu"), false},
      // Smaller values keep the CNN's activations O(1), so few max-pool windows change their
      // maximum within a finite-difference step.
      {"cnn_gelu", Spec("cnn", 64, 4, {6}, "gelu", 0, {3, 4}), true, 0.2f},
      {"cnn_relu", Spec("cnn", 64, 4, {6}, "relu", 0, {3, 4}), false, 0.2f},
      {"sparse_linear", Spec("sparse_linear", 40, 3), true},
      {"sparse_embedding_gelu", Spec("sparse_linear", 40, 3, {6}, "gelu", 5), true},
      {"sparse_embedding_relu", Spec("sparse_linear", 40, 3, {6}, "relu", 5), false},
      {"graph_conv_gelu", testing::ConvGraph(6, 3, "gelu"), true, 0.3f},
      {"graph_conv_relu", testing::ConvGraph(6, 3, "relu"), false, 0.3f},
      {"graph_lr", testing::LrGraph(40), true},
      {"graph_bag_softmax", testing::BagSoftmaxGraph(40, 3), true},
      {"graph_fm", testing::FmGraph(4, kFieldSize, 3), true, 0.5f, 0, 4},
      {"graph_wide_deep_gelu", testing::WideDeepGraph(3, 4, kFieldSize, 3, "gelu"), true, 0.5f, 3,
       4},
      {"graph_wide_deep_relu", testing::WideDeepGraph(3, 4, kFieldSize, 3, "relu"), false, 0.5f, 3,
       4},
      {"graph_dlrm_gelu", testing::DlrmGraph(3, 4, kFieldSize, 3, "gelu"), true, 0.5f, 3, 4},
      {"graph_dlrm_relu", testing::DlrmGraph(3, 4, kFieldSize, 3, "relu"), false, 0.5f, 3, 4},
  };
}

class ModelGradientTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    auto backend = CreateBackend(KERNELS_TEST_DEVICE, BackendOptions());
    if (!backend.ok()) {
      if (std::string(KERNELS_TEST_DEVICE) == "cuda") GTEST_SKIP() << backend.status();
      FAIL() << backend.status();
    }
    backend_ = std::move(*backend);
    seed_ = testing::FreshSeed();
    rng_.seed(seed_);
  }

  double Loss(Model& model, const OwnedBatch& batch, const OwnedParams& params) {
    StepResult r;
    absl::Status s = model.Evaluate(batch.view(), params.view(), &r);
    EXPECT_TRUE(s.ok()) << s;
    return r.loss;
  }

  std::unique_ptr<Backend> backend_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

TEST_P(ModelGradientTest, BackwardMatchesFiniteDifferences) {
  const Case& c = GetParam();
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  auto created = CreateModel(c.spec, backend_.get());
  ASSERT_TRUE(created.ok()) << created.status();
  Model& model = **created;
  const int64_t n = 5;
  OwnedBatch batch =
      c.fields > 0 ? testing::RandomFieldBatch(rng_, n, c.dense, c.fields, kFieldSize, 2)
      : model.input_kind() == InputKind::kDense
          ? testing::RandomDenseBatch(rng_, n, model.input_dim(), c.spec.num_classes())
          : testing::RandomSparseBatch(rng_, n, 40, 6, c.spec.num_classes());
  auto keys = model.SparseKeys(batch.view());
  ASSERT_TRUE(keys.ok()) << keys.status();
  OwnedParams params(model, *keys, rng_, c.scale);
  StepResult train;
  ASSERT_TRUE(model.TrainStep(batch.view(), params.view(), params.grad_view(), &train).ok());
  EXPECT_EQ(train.examples, n);
  EXPECT_NEAR(train.loss, Loss(model, batch, params), 1e-5 * (1 + train.loss));

  // Differences at several step sizes: large steps can cross a ReLU kink or move a max-pool
  // window's maximum, small ones carry more float32 rounding of the loss. The gradient must
  // match one of them within the tolerance plus that step's rounding allowance; a wrong gradient
  // matches none. At a kink right next to the point, the gradient is one of the one-sided
  // derivatives, so those count too.
  const double loss_noise = 4e-7 * (1.0 + train.loss);
  struct Difference {
    double value;
    double noise;  // Rounding allowance.
    std::string label;
  };
  auto check = [&](const std::string& what, double analytic,
                   const std::vector<Difference>& differences) {
    std::string tried;
    for (const Difference& d : differences) {
      const double tol = 5e-4 + 2e-2 * std::max(std::fabs(d.value), std::fabs(analytic)) + d.noise;
      if (std::fabs(d.value - analytic) <= tol) return;
      absl::StrAppend(&tried, " ", d.value, " (", d.label, ")");
    }
    ADD_FAILURE() << c.name << " " << what << ": gradient " << analytic
                  << ", finite differences" << tried;
  };

  // Central differences at each step, and one-sided ones at the smaller steps, of the loss
  // along t -> params + t * direction.
  auto differences = [&](const std::function<double(double)>& loss_at,
                         const std::vector<double>& steps) {
    const double center = loss_at(0.0);
    std::vector<Difference> out;
    for (double eps : steps) {
      const double up = loss_at(eps), down = loss_at(-eps);
      out.push_back({(up - down) / (2.0 * eps), loss_noise / eps,
                     absl::StrCat("central, step ", eps)});
      if (eps < steps.front()) {
        out.push_back({(up - center) / eps, 2 * loss_noise / eps,
                       absl::StrCat("forward, step ", eps)});
        out.push_back({(center - down) / eps, 2 * loss_noise / eps,
                       absl::StrCat("backward, step ", eps)});
      }
    }
    return out;
  };

  if (c.smooth) {
    for (size_t i = 0; i < params.values.size(); ++i) {
      const std::string& name = model.params()[i].name;
      std::vector<float>& v = params.values[i];
      ASSERT_FALSE(v.empty()) << name;
      std::uniform_int_distribution<size_t> pick(0, v.size() - 1);
      for (int trial = 0; trial < 6; ++trial) {
        const size_t j = pick(rng_);
        const float saved = v[j];
        auto loss_at = [&](double t) {
          v[j] = saved + static_cast<float>(t);
          const double l = Loss(model, batch, params);
          v[j] = saved;
          return l;
        };
        check(absl::StrCat(name, "[", j, "]"), params.grads[i][j],
              differences(loss_at, {1e-2, 1e-3, 2e-4}));
      }
    }
  }
  // Along random directions through every parameter (every model, ReLU ones included).
  for (int trial = 0; trial < 3; ++trial) {
    std::normal_distribution<float> normal;
    std::vector<std::vector<float>> dir;
    double analytic = 0;
    for (size_t i = 0; i < params.values.size(); ++i) {
      dir.emplace_back(params.values[i].size());
      for (size_t j = 0; j < dir[i].size(); ++j) {
        dir[i][j] = normal(rng_);
        analytic += static_cast<double>(dir[i][j]) * params.grads[i][j];
      }
    }
    auto loss_at = [&](double t) {
      OwnedParams moved = params;
      for (size_t i = 0; i < dir.size(); ++i) {
        for (size_t j = 0; j < dir[i].size(); ++j) {
          moved.values[i][j] += static_cast<float>(t) * dir[i][j];
        }
      }
      return Loss(model, batch, moved);
    };
    check(absl::StrCat("direction ", trial), analytic, differences(loss_at, {1e-3, 1e-4, 2e-5}));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ModelGradientTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace pscluster::kernels
