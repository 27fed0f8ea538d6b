// The documented update rules in float64, one element at a time: the reference the server's
// float32 optimizers are checked against.
#ifndef PSCLUSTER_SERVER_TESTING_REFERENCE_OPTIMIZER_H_
#define PSCLUSTER_SERVER_TESTING_REFERENCE_OPTIMIZER_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "server/optimizer.h"

namespace pscluster {
namespace testing {

struct Ref {  // float64 state of one element.
  double w, s0 = 0, s1 = 0;
};

inline void RefStep(const OptimizerParams& p, int64_t t, double g, Ref* r) {
  const double lr = p.learning_rate, wd = p.weight_decay;
  switch (p.kind) {
    case v1::OptimizerSpec::SGD:
      r->w -= lr * (g + wd * r->w);
      break;
    case v1::OptimizerSpec::MOMENTUM: {
      double gi = g + wd * r->w;
      r->s0 = p.momentum * r->s0 + gi;
      r->w -= p.nesterov ? lr * (gi + p.momentum * r->s0) : lr * r->s0;
      break;
    }
    case v1::OptimizerSpec::ADAGRAD: {
      double gi = g + wd * r->w;
      r->s0 += gi * gi;
      r->w -= lr * gi / (std::sqrt(r->s0) + p.epsilon);
      break;
    }
    case v1::OptimizerSpec::ADAM: {
      if (p.decoupled_weight_decay) r->w -= lr * wd * r->w;
      double gi = p.decoupled_weight_decay ? g : g + wd * r->w;
      r->s0 = p.beta1 * r->s0 + (1 - p.beta1) * gi;
      r->s1 = p.beta2 * r->s1 + (1 - p.beta2) * gi * gi;
      double mhat = r->s0 / (1 - std::pow(static_cast<double>(p.beta1), t));
      double vhat = r->s1 / (1 - std::pow(static_cast<double>(p.beta2), t));
      r->w -= lr * mhat / (std::sqrt(vhat) + p.epsilon);
      break;
    }
    default:
      ADD_FAILURE() << "no reference for optimizer kind " << p.kind;
  }
}

}  // namespace testing
}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_TESTING_REFERENCE_OPTIMIZER_H_
