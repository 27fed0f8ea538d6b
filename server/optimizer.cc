#include "server/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/limits.h"

namespace pscluster {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view member, absl::string_view why,
                 float value) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ".", member, " = ", value, ": ", why));
}

// The loops below are written so that the compiler vectorises them; target_clones adds an AVX2
// version picked at load time on CPUs that have it.
#define PS_KERNEL __attribute__((target_clones("avx2", "default")))

PS_KERNEL void Sgd(size_t n, const float* __restrict g, float* __restrict w, float lr, float wd) {
  for (size_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
}

PS_KERNEL void Momentum(size_t n, const float* __restrict g, float* __restrict w,
                        float* __restrict v, float lr, float wd, float mu, bool nesterov) {
  if (nesterov) {
    for (size_t i = 0; i < n; ++i) {
      float gi = g[i] + wd * w[i];
      float vi = mu * v[i] + gi;
      v[i] = vi;
      w[i] -= lr * (gi + mu * vi);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      float vi = mu * v[i] + g[i] + wd * w[i];
      v[i] = vi;
      w[i] -= lr * vi;
    }
  }
}

PS_KERNEL void Adagrad(size_t n, const float* __restrict g, float* __restrict w,
                       float* __restrict a, float lr, float wd, float eps) {
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i] + wd * w[i];
    float ai = a[i] + gi * gi;
    a[i] = ai;
    w[i] -= lr * gi / (std::sqrt(ai) + eps);
  }
}

// step = lr / (1 - beta1^t); inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t) (the PyTorch formulation).
PS_KERNEL void Adam(size_t n, const float* __restrict g, float* __restrict w, float* __restrict m,
                    float* __restrict v, float b1, float b2, float step, float inv_sqrt_bc2,
                    float eps, float coupled_wd, float decay_factor) {
  const float c1 = 1.f - b1, c2 = 1.f - b2;
  for (size_t i = 0; i < n; ++i) {
    float wi = w[i] * decay_factor;
    float gi = g[i] + coupled_wd * wi;
    float mi = b1 * m[i] + c1 * gi;
    float vi = b2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi - step * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace

int OptimizerParams::num_slots() const {
  switch (kind) {
    case v1::OptimizerSpec::MOMENTUM:
    case v1::OptimizerSpec::ADAGRAD:
      return 1;
    case v1::OptimizerSpec::ADAM:
      return 2;
    default:
      return 0;
  }
}

absl::StatusOr<OptimizerParams> ResolveOptimizer(const v1::OptimizerSpec& spec,
                                                 absl::string_view field) {
  OptimizerParams p;
  if (!v1::OptimizerSpec::Kind_IsValid(spec.kind())) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".kind: unknown optimizer ", spec.kind()));
  }
  p.kind = spec.kind();
  const float lr = spec.learning_rate();
  if (!std::isfinite(lr) || lr <= 0.f) {
    return Bad(field, "learning_rate", "must be a finite number > 0", lr);
  }
  p.learning_rate = lr;
  if (!std::isfinite(spec.weight_decay()) || spec.weight_decay() < 0.f) {
    return Bad(field, "weight_decay", "must be finite and >= 0", spec.weight_decay());
  }
  p.weight_decay = spec.weight_decay();
  if (!(spec.momentum() >= 0.f && spec.momentum() < 1.f)) {
    return Bad(field, "momentum", "must be in [0, 1)", spec.momentum());
  }
  p.momentum = spec.momentum();
  p.nesterov = spec.nesterov();
  if (!(spec.beta1() >= 0.f && spec.beta1() < 1.f)) {
    return Bad(field, "beta1", "must be in [0, 1)", spec.beta1());
  }
  if (!(spec.beta2() >= 0.f && spec.beta2() < 1.f)) {
    return Bad(field, "beta2", "must be in [0, 1)", spec.beta2());
  }
  p.beta1 = spec.beta1() == 0.f ? 0.9f : spec.beta1();
  p.beta2 = spec.beta2() == 0.f ? 0.999f : spec.beta2();
  if (!std::isfinite(spec.epsilon()) || spec.epsilon() < 0.f) {
    return Bad(field, "epsilon", "must be finite and >= 0", spec.epsilon());
  }
  p.epsilon = spec.epsilon() != 0.f ? spec.epsilon()
                                    : (p.kind == v1::OptimizerSpec::ADAGRAD ? 1e-10f : 1e-8f);
  p.decoupled_weight_decay = spec.decoupled_weight_decay();
  if (!std::isfinite(spec.initial_accumulator()) || spec.initial_accumulator() < 0.f) {
    return Bad(field, "initial_accumulator", "must be finite and >= 0", spec.initial_accumulator());
  }
  p.initial_accumulator = spec.initial_accumulator() == 0.f ? 0.1f : spec.initial_accumulator();
  if (!v1::OptimizerSpec::Schedule_IsValid(spec.lr_schedule())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".lr_schedule: unknown schedule ", spec.lr_schedule()));
  }
  p.schedule = spec.lr_schedule();
  if (!(spec.lr_min_ratio() >= 0.f && spec.lr_min_ratio() <= 1.f)) {
    return Bad(field, "lr_min_ratio", "must be in [0, 1]", spec.lr_min_ratio());
  }
  p.min_ratio = spec.lr_min_ratio();
  if (spec.lr_decay_steps() > kMaxScheduleSteps || spec.lr_warmup_steps() > kMaxScheduleSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".lr_decay_steps/lr_warmup_steps: larger than 2^50"));
  }
  p.decay_steps = static_cast<int64_t>(spec.lr_decay_steps());
  p.warmup_steps = static_cast<int64_t>(spec.lr_warmup_steps());
  if (p.schedule == v1::OptimizerSpec::COSINE && p.decay_steps == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".lr_decay_steps: a COSINE schedule needs the number of steps to decay over"));
  }
  return p;
}

float LearningRateAt(const OptimizerParams& p, int64_t step) {
  if (step < 0) step = 0;
  double scale = 1.0;
  if (p.warmup_steps > 0 && step < p.warmup_steps) {
    scale = static_cast<double>(step + 1) / static_cast<double>(p.warmup_steps);
  }
  if (p.schedule == v1::OptimizerSpec::COSINE && p.decay_steps > 0) {
    const int64_t span = std::max<int64_t>(1, p.decay_steps - p.warmup_steps);
    const double progress =
        std::min(1.0, std::max(0.0, static_cast<double>(step - p.warmup_steps) / span));
    const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
    scale *= p.min_ratio + (1.0 - p.min_ratio) * cosine;
  }
  return static_cast<float>(p.learning_rate * scale);
}

OptimizerParams AtStep(const OptimizerParams& p, int64_t step) {
  if (p.schedule == v1::OptimizerSpec::CONSTANT && p.warmup_steps == 0) return p;
  OptimizerParams q = p;
  q.learning_rate = LearningRateAt(p, step);
  return q;
}

void InitSlots(const OptimizerParams& p, float* slots, size_t n) {
  const size_t total = n * static_cast<size_t>(p.num_slots());
  const float first = p.kind == v1::OptimizerSpec::ADAGRAD ? p.initial_accumulator : 0.f;
  for (size_t i = 0; i < total; ++i) slots[i] = i < n ? first : 0.f;
}

void ApplyUpdate(const OptimizerParams& p, int64_t t, size_t n, const float* g, float* w,
                 float* slot0, float* slot1) {
  switch (p.kind) {
    case v1::OptimizerSpec::SGD:
      Sgd(n, g, w, p.learning_rate, p.weight_decay);
      return;
    case v1::OptimizerSpec::MOMENTUM:
      Momentum(n, g, w, slot0, p.learning_rate, p.weight_decay, p.momentum, p.nesterov);
      return;
    case v1::OptimizerSpec::ADAGRAD:
      Adagrad(n, g, w, slot0, p.learning_rate, p.weight_decay, p.epsilon);
      return;
    case v1::OptimizerSpec::ADAM: {
      const double td = static_cast<double>(t < 1 ? 1 : t);
      const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), td);
      const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), td);
      const float step = static_cast<float>(p.learning_rate / bc1);
      const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
      const float coupled = p.decoupled_weight_decay ? 0.f : p.weight_decay;
      const float decay = p.decoupled_weight_decay ? 1.f - p.learning_rate * p.weight_decay : 1.f;
      Adam(n, g, w, slot0, slot1, p.beta1, p.beta2, step, inv_sqrt_bc2, p.epsilon, coupled, decay);
      return;
    }
    default:
      return;
  }
}

}  // namespace pscluster
