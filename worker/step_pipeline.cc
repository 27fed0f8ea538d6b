#include "worker/step_pipeline.h"

#include <future>
#include <memory>
#include <utility>

#include "common/executor.h"
#include "common/logging.h"

namespace pscluster::worker {
namespace {

std::future<absl::Status> RunOn(Executor* ex, std::function<absl::Status()> fn) {
  auto task = std::make_shared<std::packaged_task<absl::Status()>>(std::move(fn));
  std::future<absl::Status> f = task->get_future();
  ex->Post([task] { (*task)(); });
  return f;
}

}  // namespace

StepPipeline::StepPipeline(kernels::Model* model, kernels::Backend* backend, ParamClient* client,
                           TrainSource* data, ProgressReporter* reporter,
                           const Schedule& schedule, bool prefetch, std::string log_prefix,
                           StepPipelineHooks hooks)
    : model_(model),
      backend_(backend),
      client_(client),
      data_(data),
      reporter_(reporter),
      schedule_(schedule),
      prefetch_(prefetch),
      overlap_uploads_(prefetch && !backend->shares_host_memory()),
      log_prefix_(std::move(log_prefix)),
      hooks_(std::move(hooks)) {}

absl::Status StepPipeline::Prepare(int64_t n) {
  if (std::optional<data::PartitionSpec> next = hooks_.take_partition()) {
    auto now = data_->Repartition(*next);
    if (now.ok()) {
      Logger("worker")->info("{}: {}", log_prefix_, *now);
      reporter_->SetPart(data_->examples(), data_->batch());
    } else {
      Logger("worker")->warn("{}: partition update not applied: {}", log_prefix_,
                             now.status().message());
    }
  }
  auto batch = data_->BatchFor(n);
  if (!batch.ok()) return batch.status();
  batches_[n & 1] = *batch;
  auto keys = model_->SparseKeys(batches_[n & 1]);
  if (!keys.ok()) return keys.status();
  return PrepareSlot(*model_, backend_, std::move(*keys), &slots_[n % 3]);
}

absl::Status StepPipeline::Run(int64_t start_step) {
  const int64_t total_steps = schedule_.total_steps;
  const int64_t steps_per_epoch = schedule_.steps_per_epoch;
  ParamClient* psc = client_;
  // Prefetched pulls and background pushes run on two long-lived threads (one call in flight on
  // each), not on a new thread per call. Declared before the futures, so that the futures are
  // destroyed first and each thread finishes what it runs before it is joined.
  std::unique_ptr<Executor> pull_thread, push_thread;
  if (prefetch_) {
    pull_thread = std::make_unique<Executor>(1, "prefetch");
    push_thread = std::make_unique<Executor>(1, "push");
  }
  std::future<absl::Status> pending_push, pending_pull;
  auto start_pull = [&](int64_t n) {
    PullTargets targets = TargetsOf(*model_, &slots_[n % 3], true, true);
    pending_pull = RunOn(pull_thread.get(), [psc, n, targets = std::move(targets)] {
      return psc->Pull(n, targets);
    });
  };
  auto wait = [&](std::future<absl::Status>* f, bool push) -> absl::Status {
    if (!f->valid()) return absl::OkStatus();
    absl::Time t0 = absl::Now();
    absl::Status ps = f->get();
    push ? reporter_->AddPushWait(absl::Now() - t0) : reporter_->AddPullWait(absl::Now() - t0);
    return ps;
  };
  auto drain = [&]() {
    if (pending_pull.valid()) pending_pull.wait();
    if (pending_push.valid()) pending_push.wait();
  };

  // Without prefetching (BSP, SSP with s = 0), the push of step n and the pull of step n + 1 go
  // out as one push-pull round per server: each block's new value comes back as soon as the
  // server has applied it (and the consistency model allows the read), with no second round trip.
  const bool fused = !prefetch_;
  int64_t step = start_step;
  if (step < total_steps) {
    absl::Status s0 = Prepare(step);
    if (!s0.ok()) return s0;
    if (prefetch_) {
      start_pull(step);
    } else {
      absl::Time t0 = absl::Now();
      absl::Status ps = psc->Pull(step, TargetsOf(*model_, &slots_[step % 3], true, true));
      reporter_->AddPullWait(absl::Now() - t0);
      if (!ps.ok()) return ps;
    }
  }
  for (int64_t epoch = step / steps_per_epoch; epoch * steps_per_epoch < total_steps; ++epoch) {
    const absl::Time epoch_start = absl::Now();
    if (train_start_ == absl::Time()) train_start_ = epoch_start;
    for (int64_t j = step - epoch * steps_per_epoch; j < steps_per_epoch; ++j, ++step) {
      if (hooks_.cancelled()) {
        drain();
        return absl::CancelledError("cancelled");
      }
      ParamSlot& slot = slots_[step % 3];
      if (prefetch_) {
        absl::Status ps = wait(&pending_pull, false);
        if (!ps.ok()) {
          drain();
          return ps;
        }
      }
      if (step + 1 < total_steps) {
        absl::Status s1 = Prepare(step + 1);
        if (!s1.ok()) {
          drain();
          return s1;
        }
        if (prefetch_) start_pull(step + 1);
      }
      absl::Time t1 = absl::Now();
      absl::Duration pulled;  // Waiting for step n + 1's pull while step n computes.
      kernels::StepResult r;
      kernels::Gradients grads = GradientsOf(&slot);
      grads.scale = hooks_.grad_scale(batches_[step & 1].num_examples);  // In the loss kernel.
      absl::Status cs = model_->StartTrainStep(batches_[step & 1], ValuesOf(slot), grads);
      if (cs.ok() && overlap_uploads_ && step + 1 < total_steps) {
        // While the device computes step n, step n + 1's parameters go to it (the model's
        // upload stream), as soon as their pull is in.
        absl::Time t0 = absl::Now();
        absl::Status ps = wait(&pending_pull, false);
        pulled = absl::Now() - t0;
        if (ps.ok()) ps = model_->PrefetchParams(ValuesOf(slots_[(step + 1) % 3]));
        if (!ps.ok()) {
          model_->FinishStep(&r).IgnoreError();  // Waited for; the pull's error is the one.
          drain();
          return ps;
        }
      }
      if (cs.ok()) cs = model_->FinishStep(&r);
      if (!cs.ok()) {
        drain();
        return cs;
      }
      reporter_->AddStep(r, absl::Now() - t1 - pulled);
      hooks_.computed(step);

      if (fused) {
        absl::Time t0 = absl::Now();
        absl::Status ps =
            step + 1 < total_steps
                ? psc->PushPull(step, SourcesOf(*model_, slot),
                                TargetsOf(*model_, &slots_[(step + 1) % 3], true, true))
                : psc->Push(step, SourcesOf(*model_, slot));
        reporter_->AddPullWait(absl::Now() - t0);
        if (!ps.ok()) {
          drain();
          return ps;
        }
      } else {
        // Step n - 1's push must be done before step n's starts (one push in flight, in order).
        absl::Status prev = wait(&pending_push, true);
        if (!prev.ok()) {
          drain();
          return prev;
        }
        PushSources sources = SourcesOf(*model_, slot);
        pending_push = RunOn(push_thread.get(), [psc, step, sources = std::move(sources)] {
          return psc->Push(step, sources);
        });
      }
      if (!reporter_->Report(step + 1, false)) {
        drain();
        return absl::CancelledError("cancelled");
      }
    }
    absl::Status prev = wait(&pending_push, true);
    if (!prev.ok()) {
      drain();
      return prev;
    }
    train_end_ = absl::Now();
    train_time_ += train_end_ - epoch_start;
    absl::Status done = hooks_.epoch_done(epoch, step);
    if (!done.ok()) {
      drain();
      return done;
    }
  }
  return absl::OkStatus();
}

}  // namespace pscluster::worker
