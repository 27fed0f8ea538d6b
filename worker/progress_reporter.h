// A task's progress as the scheduler sees it: what the steps of the last reporting window did
// (loss, accuracy, examples/s, time waiting for pulls, computing, pushing), the latest
// evaluation and export, sent to the ProgressSink at most every `interval` and whenever forced.
//
// Thread model: the task thread only (the snapshot it publishes is the caller's to guard).
#ifndef PSCLUSTER_WORKER_PROGRESS_REPORTER_H_
#define PSCLUSTER_WORKER_PROGRESS_REPORTER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "kernels/models/model.h"
#include "proto/scheduler.pb.h"
#include "worker/task_runner.h"
#include "worker/training_data.h"

namespace pscluster::worker {

class ProgressReporter {
 public:
  // `publish` receives the task's snapshot at each report (steps done, rate, time totals).
  // REQUIRES: sink outlives the reporter.
  ProgressReporter(uint32_t rank, int64_t total_steps, int64_t steps_per_epoch,
                   absl::Duration interval, ProgressSink* sink,
                   std::function<void(const TaskSnapshot&)> publish);

  // This rank's part: examples and examples per step.
  void SetPart(int64_t examples, int64_t batch);
  // `auc`: -1 when the model has no AUC (more than two classes, or one class in the test set).
  void SetEvaluation(double accuracy, double loss, double auc = -1);
  void SetExportPath(const std::string& path);
  // Where each report reads the data's statistics. REQUIRES: `data` outlives the reporter.
  void SetDataSource(const TrainSource* data) { data_ = data; }

  // One step computed in `compute`.
  void AddStep(const kernels::StepResult& r, absl::Duration compute);
  // Time the task waited for a pull (or a push-pull round) and for a background push.
  void AddPullWait(absl::Duration d);
  void AddPushWait(absl::Duration d);

  // Sends the window's progress at `done_steps` when `interval` has passed since the last
  // report, or now when `force`. False when the sink says the task should stop.
  bool Report(int64_t done_steps, bool force);

  const v1::WorkerProgress& progress() const { return progress_; }
  int64_t examples_trained() const { return run_examples_; }
  absl::Duration total_pull() const { return tot_pull_; }
  absl::Duration total_compute() const { return tot_compute_; }
  absl::Duration total_push() const { return tot_push_; }

 private:
  const int64_t steps_per_epoch_;
  const absl::Duration interval_;
  ProgressSink* const sink_;
  const std::function<void(const TaskSnapshot&)> publish_;
  const TrainSource* data_ = nullptr;
  v1::WorkerProgress progress_;
  double win_loss_ = 0;
  int64_t win_correct_ = 0, win_examples_ = 0;
  absl::Duration win_pull_, win_compute_, win_push_, tot_pull_, tot_compute_, tot_push_;
  absl::Time win_start_ = absl::Now();
  int64_t run_examples_ = 0;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_PROGRESS_REPORTER_H_
