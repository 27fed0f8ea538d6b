#include "worker/evaluator.h"

#include <utility>

namespace pscluster::worker {

absl::StatusOr<Evaluation> Evaluate(kernels::Model& model, kernels::Backend* backend,
                                    PsClient* client, TestSource* test, int64_t clock,
                                    int64_t eval_batch, ParamSlot* slot) {
  absl::Status started = test->Start();
  if (!started.ok()) return started;
  Evaluation e;
  double loss = 0;
  int64_t correct = 0;
  bool dense_pulled = false;
  while (true) {
    auto b = test->Next(eval_batch);
    if (!b.ok()) return b.status();
    if (b->num_examples == 0) break;
    auto keys = model.SparseKeys(*b);
    if (!keys.ok()) return keys.status();
    // Dense values persist in the slot across batches (PrepareSlot keeps them); only sparse rows
    // change.
    absl::Status prep = PrepareSlot(model, backend, std::move(*keys), slot);
    if (!prep.ok()) return prep;
    absl::Status ps = client->Pull(clock, TargetsOf(model, slot, !dense_pulled, true));
    if (!ps.ok()) return ps;
    dense_pulled = true;
    kernels::StepResult r;
    absl::Status es = model.Evaluate(*b, ValuesOf(*slot), &r);
    if (!es.ok()) return es;
    loss += r.loss * r.examples;
    correct += r.correct;
    e.examples += b->num_examples;
  }
  if (e.examples == 0) return absl::FailedPreconditionError("the test set holds no examples");
  e.loss = loss / e.examples;
  e.accuracy = static_cast<double>(correct) / e.examples;
  return e;
}

}  // namespace pscluster::worker
