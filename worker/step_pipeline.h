// The training loop of one task: for every step, its batch, the pull of its parameters, the
// model's forward and backward, and the push of its gradients, overlapped as the consistency
// model allows:
//  * BSP (and SSP with s = 0): after computing step n the worker sends one push-pull round per
//    server, pushing step n's gradients and reading step n+1's parameters; each block's new value
//    comes back as soon as the server has applied it and the slowest worker allows the read.
//  * SSP with s >= 1 and ASP: the pull of step n+1 is issued before step n is computed
//    (prefetch), and the push of step n runs on a second thread while step n+1 computes (one
//    push in flight, in order). On a device (a backend that does not share host memory), step
//    n is started, then step n+1's pull is waited for and its parameters sent to the device
//    while step n computes (Model::PrefetchParams), then step n is finished and pushed: the
//    upload leaves step n+1's critical path, and step n's push starts once both are done.
// Buffers rotate over three slots (param_slots.h) so that a pull, a computation and a push never
// share one.
//
// Thread model: Run() on the task thread; with prefetch, one pull thread and one push thread of
// its own, each with one call in flight. Hooks run on the task thread.
#ifndef PSCLUSTER_WORKER_STEP_PIPELINE_H_
#define PSCLUSTER_WORKER_STEP_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/backend.h"
#include "kernels/models/model.h"
#include "server/client/param_client.h"
#include "worker/param_slots.h"
#include "worker/progress_reporter.h"
#include "worker/training_data.h"

namespace pscluster::worker {

struct StepPipelineHooks {
  // True once the task should stop (checked at every step).
  std::function<bool()> cancelled;
  // A new data partition to read from the next batch on, if one arrived.
  std::function<std::optional<data::PartitionSpec>()> take_partition;
  // Step n was computed (its push is under way).
  std::function<void(int64_t n)> computed;
  // After the last step of `epoch`, its pushes done (`step` = steps done): evaluation, reports.
  std::function<absl::Status(int64_t epoch, int64_t step)> epoch_done;
  // The gradient weight of a step of `examples` (aggregated steps: the rank's share).
  std::function<float(int64_t examples)> grad_scale;
};

class StepPipeline {
 public:
  // `log_prefix` starts the log lines ("job job-1 rank 0"). REQUIRES: every pointer outlives
  // the pipeline.
  StepPipeline(kernels::Model* model, kernels::Backend* backend, ParamClient* client,
               TrainSource* data, ProgressReporter* reporter, const Schedule& schedule,
               bool prefetch, std::string log_prefix, StepPipelineHooks hooks);

  // Trains from `start_step` to the schedule's end. CANCELLED once `hooks.cancelled` says so;
  // the first error of a pull, step or push otherwise. Every call in flight is waited for
  // before it returns.
  absl::Status Run(int64_t start_step);

  // Time in the step loop (evaluation between epochs excluded), and when it began and ended.
  absl::Duration train_time() const { return train_time_; }
  absl::Time train_start() const { return train_start_; }
  absl::Time train_end() const { return train_end_; }

 private:
  // Step n's batch into slot n % 3, after taking a new partition if one arrived.
  absl::Status Prepare(int64_t n);

  kernels::Model* const model_;
  kernels::Backend* const backend_;
  ParamClient* const client_;
  TrainSource* const data_;
  ProgressReporter* const reporter_;
  const Schedule schedule_;
  const bool prefetch_;
  // prefetch_ on a backend with device memory of its own: step n+1's parameters are uploaded
  // while step n computes.
  const bool overlap_uploads_;
  const std::string log_prefix_;
  const StepPipelineHooks hooks_;
  ParamSlot slots_[3];
  kernels::Batch batches_[2];
  absl::Duration train_time_;
  absl::Time train_start_, train_end_;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_STEP_PIPELINE_H_
