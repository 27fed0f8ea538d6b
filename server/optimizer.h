// Update rules applied by the server to a table's values: SGD, momentum (with Nesterov), Adagrad
// and Adam/AdamW, as documented on v1::OptimizerSpec. State ("slots") lives beside the weights:
// momentum and Adagrad keep one float per element, Adam two.
#ifndef PSCLUSTER_SERVER_OPTIMIZER_H_
#define PSCLUSTER_SERVER_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"

namespace pscluster {

// An OptimizerSpec with its defaults filled in.
struct OptimizerParams {
  v1::OptimizerSpec::Kind kind = v1::OptimizerSpec::SGD;
  float learning_rate = 0.01f;
  float weight_decay = 0.f;
  float momentum = 0.f;
  bool nesterov = false;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  bool decoupled_weight_decay = false;
  float initial_accumulator = 0.1f;
  v1::OptimizerSpec::Schedule schedule = v1::OptimizerSpec::CONSTANT;
  int64_t decay_steps = 0;
  float min_ratio = 0.f;
  int64_t warmup_steps = 0;

  // Slots per element: 0 (SGD), 1 (momentum, Adagrad) or 2 (Adam).
  int num_slots() const;
};

// Validates `spec` and fills defaults. INVALID_ARGUMENT names `field` (e.g.
// "tables[2].optimizer") plus the member at fault: a learning rate that is negative, zero, NaN
// or infinite, a negative or non-finite weight decay, momentum/betas outside [0, 1), a negative
// epsilon or accumulator, an unknown kind, a COSINE schedule without decay steps or with
// lr_min_ratio outside [0, 1].
absl::StatusOr<OptimizerParams> ResolveOptimizer(const v1::OptimizerSpec& spec,
                                                 absl::string_view field);

// The learning rate for updates tagged with training step `step` (see OptimizerSpec.Schedule).
float LearningRateAt(const OptimizerParams& p, int64_t step);

// `p` with its learning rate set for `step`; `p` itself when the rate is constant.
OptimizerParams AtStep(const OptimizerParams& p, int64_t step);

// Sets the initial slot values of `n` elements (Adagrad's accumulator starts at
// initial_accumulator; everything else at 0). `slots` holds num_slots() arrays of n floats, one
// after another.
void InitSlots(const OptimizerParams& p, float* slots, size_t n);

// Applies one update to n elements: `w` the weights, `slot0`/`slot1` the state arrays (unused
// ones may be null), `g` the gradient. `t` is the number of updates including this one (>= 1),
// used by Adam's bias correction. Pointers need not be aligned beyond float.
void ApplyUpdate(const OptimizerParams& p, int64_t t, size_t n, const float* g, float* w,
                 float* slot0, float* slot1);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_OPTIMIZER_H_
