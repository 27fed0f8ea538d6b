#include "worker/progress_reporter.h"

#include <algorithm>
#include <utility>

namespace pscluster::worker {
namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

ProgressReporter::ProgressReporter(uint32_t rank, int64_t total_steps, int64_t steps_per_epoch,
                                   absl::Duration interval, ProgressSink* sink,
                                   std::function<void(const TaskSnapshot&)> publish)
    : steps_per_epoch_(steps_per_epoch),
      interval_(interval),
      sink_(sink),
      publish_(std::move(publish)) {
  progress_.set_rank(rank);
  progress_.set_total_steps(total_steps);
  progress_.set_test_accuracy(-1);
  progress_.set_test_auc(-1);
  progress_.set_test_loss(-1);
}

void ProgressReporter::SetPart(int64_t examples, int64_t batch) {
  progress_.set_examples(examples);
  progress_.set_batch_size(static_cast<uint32_t>(batch));
}

void ProgressReporter::SetEvaluation(double accuracy, double loss, double auc) {
  progress_.set_test_accuracy(accuracy);
  progress_.set_test_loss(loss);
  progress_.set_test_auc(auc);
}

void ProgressReporter::SetExportPath(const std::string& path) { progress_.set_export_path(path); }

void ProgressReporter::AddStep(const kernels::StepResult& r, absl::Duration compute) {
  win_compute_ += compute;
  tot_compute_ += compute;
  win_loss_ += r.loss * r.examples;
  win_correct_ += r.correct;
  win_examples_ += r.examples;
  run_examples_ += r.examples;
}

void ProgressReporter::AddPullWait(absl::Duration d) {
  win_pull_ += d;
  tot_pull_ += d;
}

void ProgressReporter::AddPushWait(absl::Duration d) {
  win_push_ += d;
  tot_push_ += d;
}

bool ProgressReporter::Report(int64_t done_steps, bool force) {
  absl::Time now = absl::Now();
  if (!force && now - win_start_ < interval_) return true;
  double secs = std::max(1e-9, Seconds(now - win_start_));
  progress_.set_step(done_steps);
  progress_.set_epoch(static_cast<uint32_t>(done_steps / steps_per_epoch_));
  if (win_examples_ > 0) {
    progress_.set_loss(win_loss_ / win_examples_);
    progress_.set_train_accuracy(static_cast<double>(win_correct_) / win_examples_);
    progress_.set_samples_per_sec(win_examples_ / secs);
  }
  progress_.set_pull_wait_sec(Seconds(win_pull_));
  progress_.set_compute_sec(Seconds(win_compute_));
  progress_.set_push_sec(Seconds(win_push_));
  progress_.set_compute_rate(win_compute_ > absl::ZeroDuration()
                                 ? win_examples_ / Seconds(win_compute_)
                                 : 0.0);
  TaskSnapshot snap;
  if (data_ != nullptr) {
    const DataStats ds = data_->stats();
    progress_.set_data_bytes_read(ds.bytes_read);
    progress_.set_data_lines_skipped(ds.skipped_lines);
    snap.data_bytes_read = ds.bytes_read;
    snap.data_lines_skipped = ds.skipped_lines;
  }
  snap.step = done_steps;
  snap.samples_per_sec = progress_.samples_per_sec();
  snap.pull_wait_sec = Seconds(tot_pull_);
  snap.compute_sec = Seconds(tot_compute_);
  snap.push_sec = Seconds(tot_push_);
  publish_(snap);
  win_loss_ = 0;
  win_correct_ = win_examples_ = 0;
  win_pull_ = win_compute_ = win_push_ = absl::ZeroDuration();
  win_start_ = now;
  return sink_->Report(progress_);
}

}  // namespace pscluster::worker
