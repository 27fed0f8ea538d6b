// Test-set evaluation of the model as the servers hold it at a clock: every test batch's sparse
// rows (and, once, the dense parameters) pulled at that clock, then the model's loss, accuracy
// and, for a two-class model, AUC (exact: every example's score, ranked) over the whole set.
#ifndef PSCLUSTER_WORKER_EVALUATOR_H_
#define PSCLUSTER_WORKER_EVALUATOR_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/models/model.h"
#include "server/client/param_client.h"
#include "worker/param_slots.h"
#include "worker/training_data.h"

namespace pscluster::worker {

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
  double auc = -1;  // Two-class models whose test set holds both classes; else -1.
  int64_t examples = 0;
};

// `slot` holds the pulled values between batches (its dense values are pulled once).
// FAILED_PRECONDITION when the test set has no examples.
absl::StatusOr<Evaluation> Evaluate(kernels::Model& model, kernels::Backend* backend,
                                    ParamClient* client, TestSource* test, int64_t clock,
                                    int64_t eval_batch, ParamSlot* slot);

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_EVALUATOR_H_
