#include "worker/evaluator.h"

#include <utility>
#include <vector>

#include "worker/auc.h"

namespace pscluster::worker {

absl::StatusOr<Evaluation> Evaluate(kernels::Model& model, kernels::Backend* backend,
                                    ParamClient* client, TestSource* test, int64_t clock,
                                    int64_t eval_batch, ParamSlot* slot) {
  absl::Status started = test->Start();
  if (!started.ok()) return started;
  Evaluation e;
  double loss = 0;
  int64_t correct = 0;
  bool dense_pulled = false;
  const bool two_class = model.num_classes() == 2;
  AucAccumulator auc;
  std::vector<float> scores;
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
    PullTargets targets = TargetsOf(model, slot, !dense_pulled, true);
    targets.exact = true;  // The servers' weights (pull compression's copy may lag them).
    absl::Status ps = client->Pull(clock, targets);
    if (!ps.ok()) return ps;
    dense_pulled = true;
    kernels::StepResult r;
    absl::Status es = two_class ? model.EvaluateScores(*b, ValuesOf(*slot), &r, &scores)
                                : model.Evaluate(*b, ValuesOf(*slot), &r);
    if (!es.ok()) return es;
    if (two_class) {
      for (int64_t i = 0; i < b->num_examples; ++i) auc.Add(scores[i], b->labels[i]);
    }
    loss += r.loss * r.examples;
    correct += r.correct;
    e.examples += b->num_examples;
  }
  if (e.examples == 0) return absl::FailedPreconditionError("the test set holds no examples");
  e.loss = loss / e.examples;
  e.accuracy = static_cast<double>(correct) / e.examples;
  if (two_class) e.auc = auc.Auc();
  return e;
}

}  // namespace pscluster::worker
