// Each optimizer, run in float32 by the server code, against a float64 reference of the
// documented update rule over many steps.
#include "server/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "server/testing/reference_optimizer.h"

namespace pscluster {
namespace {

using testing::Ref;
using testing::RefStep;

// Minimises sum((w - target)^2 / 2) with noisy gradients for `steps` steps; n is not a multiple
// of any vector width, and the arrays start misaligned by one float.
void CheckAgainstReference(const v1::OptimizerSpec& spec, int steps, double tol) {
  auto p = ResolveOptimizer(spec, "optimizer");
  ASSERT_TRUE(p.ok()) << p.status();
  constexpr size_t n = 1003;
  std::mt19937 rng(42);
  std::normal_distribution<double> noise(0.0, 0.5);
  std::uniform_real_distribution<double> init(-1.0, 1.0);
  std::vector<float> storage(1 + n * 3);
  float* w = storage.data() + 1;
  float* s0 = w + n;
  float* s1 = w + 2 * n;
  InitSlots(*p, s0, n);
  std::vector<Ref> ref(n);
  std::vector<double> target(n);
  for (size_t i = 0; i < n; ++i) {
    w[i] = static_cast<float>(init(rng));
    ref[i].w = w[i];
    ref[i].s0 = s0[i];
    target[i] = init(rng) * 2;
  }
  std::vector<float> g(n);
  for (int t = 1; t <= steps; ++t) {
    for (size_t i = 0; i < n; ++i) {
      // The gradient is taken at the float32 weights, as a worker would; both sides apply it.
      g[i] = static_cast<float>(w[i] - target[i] + noise(rng));
    }
    ApplyUpdate(*p, t, n, g.data(), w, s0, s1);
    for (size_t i = 0; i < n; ++i) RefStep(*p, t, g[i], &ref[i]);
  }
  double max_err = 0;
  for (size_t i = 0; i < n; ++i) {
    double err = std::fabs(w[i] - ref[i].w) / (1.0 + std::fabs(ref[i].w));
    max_err = std::max(max_err, err);
    ASSERT_TRUE(std::isfinite(w[i]));
  }
  EXPECT_LT(max_err, tol) << spec.ShortDebugString();
  // The run must have moved the weights a lot (not a test of a no-op).
  double moved = 0;
  for (size_t i = 0; i < n; ++i) moved += std::fabs(ref[i].w - target[i]);
  EXPECT_LT(moved / n, 1.0) << "did not converge towards the target: " << spec.ShortDebugString();
}

v1::OptimizerSpec Spec(v1::OptimizerSpec::Kind kind, float lr, float wd = 0) {
  v1::OptimizerSpec s;
  s.set_kind(kind);
  s.set_learning_rate(lr);
  s.set_weight_decay(wd);
  return s;
}

TEST(OptimizerTest, SgdMatchesReference) {
  CheckAgainstReference(Spec(v1::OptimizerSpec::SGD, 0.05f), 1000, 1e-5);
  CheckAgainstReference(Spec(v1::OptimizerSpec::SGD, 0.05f, 0.01f), 1000, 1e-5);
}

TEST(OptimizerTest, MomentumMatchesReference) {
  auto s = Spec(v1::OptimizerSpec::MOMENTUM, 0.02f, 0.001f);
  s.set_momentum(0.9f);
  CheckAgainstReference(s, 1000, 1e-5);
}

TEST(OptimizerTest, NesterovMatchesReference) {
  auto s = Spec(v1::OptimizerSpec::MOMENTUM, 0.02f);
  s.set_momentum(0.9f);
  s.set_nesterov(true);
  CheckAgainstReference(s, 1000, 1e-5);
}

TEST(OptimizerTest, AdagradMatchesReference) {
  CheckAgainstReference(Spec(v1::OptimizerSpec::ADAGRAD, 0.2f), 1000, 1e-5);
  auto s = Spec(v1::OptimizerSpec::ADAGRAD, 0.2f, 0.01f);
  s.set_initial_accumulator(0.5f);
  s.set_epsilon(1e-6f);
  CheckAgainstReference(s, 1000, 1e-5);
}

TEST(OptimizerTest, AdamMatchesReference) {
  CheckAgainstReference(Spec(v1::OptimizerSpec::ADAM, 0.01f), 1500, 1e-4);
  auto s = Spec(v1::OptimizerSpec::ADAM, 0.01f, 0.01f);  // Coupled L2.
  s.set_beta1(0.8f);
  s.set_beta2(0.99f);
  CheckAgainstReference(s, 1500, 1e-4);
}

TEST(OptimizerTest, AdamWMatchesReference) {
  auto s = Spec(v1::OptimizerSpec::ADAM, 0.01f, 0.05f);
  s.set_decoupled_weight_decay(true);
  CheckAgainstReference(s, 1500, 1e-4);
}

TEST(OptimizerTest, DefaultsAreFilledIn) {
  auto p = ResolveOptimizer(Spec(v1::OptimizerSpec::ADAM, 0.1f), "o");
  ASSERT_TRUE(p.ok());
  EXPECT_FLOAT_EQ(p->beta1, 0.9f);
  EXPECT_FLOAT_EQ(p->beta2, 0.999f);
  EXPECT_FLOAT_EQ(p->epsilon, 1e-8f);
  EXPECT_EQ(p->num_slots(), 2);
  auto a = ResolveOptimizer(Spec(v1::OptimizerSpec::ADAGRAD, 0.1f), "o");
  EXPECT_FLOAT_EQ(a->epsilon, 1e-10f);
  EXPECT_FLOAT_EQ(a->initial_accumulator, 0.1f);
  std::vector<float> slots(4, -1.f);
  InitSlots(*a, slots.data(), 4);
  EXPECT_EQ(slots, std::vector<float>(4, 0.1f));
}

TEST(OptimizerTest, RefusesBadRatesNamingTheField) {
  for (float lr : {-0.1f, 0.f, std::nanf(""), INFINITY}) {
    auto p = ResolveOptimizer(Spec(v1::OptimizerSpec::SGD, lr), "tables[3].optimizer");
    ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << lr;
    EXPECT_NE(p.status().message().find("tables[3].optimizer.learning_rate"), std::string::npos)
        << p.status();
  }
  auto s = Spec(v1::OptimizerSpec::MOMENTUM, 0.1f);
  s.set_momentum(1.0f);
  EXPECT_NE(ResolveOptimizer(s, "o").status().message().find("o.momentum"), std::string::npos);
  s = Spec(v1::OptimizerSpec::SGD, 0.1f, -1.f);
  EXPECT_NE(ResolveOptimizer(s, "o").status().message().find("o.weight_decay"), std::string::npos);
  s = Spec(v1::OptimizerSpec::ADAM, 0.1f);
  s.set_beta2(std::nanf(""));
  EXPECT_NE(ResolveOptimizer(s, "o").status().message().find("o.beta2"), std::string::npos);
}

TEST(OptimizerTest, CosineScheduleWithWarmup) {
  v1::OptimizerSpec s;
  s.set_kind(v1::OptimizerSpec::SGD);
  s.set_learning_rate(0.2f);
  s.set_lr_schedule(v1::OptimizerSpec::COSINE);
  s.set_lr_decay_steps(1010);
  s.set_lr_warmup_steps(10);
  s.set_lr_min_ratio(0.1f);
  auto p = ResolveOptimizer(s, "o");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FLOAT_EQ(LearningRateAt(*p, 0), 0.02f);    // Warm-up: 1/10 of the rate.
  EXPECT_FLOAT_EQ(LearningRateAt(*p, 9), 0.2f);     // End of the warm-up.
  EXPECT_FLOAT_EQ(LearningRateAt(*p, 10), 0.2f);    // Decay starts at full rate.
  // Half way through the decay: min + (1 - min) / 2 of the rate.
  EXPECT_NEAR(LearningRateAt(*p, 510), 0.2f * (0.1f + 0.9f * 0.5f), 1e-6f);
  EXPECT_NEAR(LearningRateAt(*p, 1010), 0.02f, 1e-7f);   // Floor at lr_min_ratio.
  EXPECT_NEAR(LearningRateAt(*p, 100000), 0.02f, 1e-7f);
  for (int64_t t = 10; t < 1010; ++t) {
    ASSERT_LE(LearningRateAt(*p, t + 1), LearningRateAt(*p, t)) << t;  // Never rises.
  }
  // AtStep carries the scheduled rate; a constant schedule is left alone.
  EXPECT_FLOAT_EQ(AtStep(*p, 510).learning_rate, LearningRateAt(*p, 510));
  auto c = ResolveOptimizer(Spec(v1::OptimizerSpec::SGD, 0.3f), "o");
  EXPECT_FLOAT_EQ(AtStep(*c, 12345).learning_rate, 0.3f);
  // SGD with the schedule applies exactly the scheduled step.
  std::vector<float> w = {1.f}, g = {2.f};
  ApplyUpdate(AtStep(*p, 510), 1, 1, g.data(), w.data(), nullptr, nullptr);
  EXPECT_NEAR(w[0], 1.f - 2.f * LearningRateAt(*p, 510), 1e-6f);
}

TEST(OptimizerTest, RefusesBadSchedulesNamingTheField) {
  v1::OptimizerSpec s = Spec(v1::OptimizerSpec::ADAM, 0.1f);
  s.set_lr_schedule(v1::OptimizerSpec::COSINE);
  auto p = ResolveOptimizer(s, "tables[0].optimizer");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("tables[0].optimizer.lr_decay_steps"), std::string::npos)
      << p.status();
  s.set_lr_decay_steps(100);
  s.set_lr_min_ratio(1.5f);
  p = ResolveOptimizer(s, "o");
  EXPECT_NE(p.status().message().find("o.lr_min_ratio"), std::string::npos) << p.status();
  s.set_lr_min_ratio(std::nanf(""));
  EXPECT_FALSE(ResolveOptimizer(s, "o").ok());
  s.set_lr_min_ratio(0);
  s.set_lr_schedule(static_cast<v1::OptimizerSpec::Schedule>(9));
  EXPECT_NE(ResolveOptimizer(s, "o").status().message().find("o.lr_schedule"), std::string::npos);
}

}  // namespace
}  // namespace pscluster
