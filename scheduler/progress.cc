#include "scheduler/progress.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"

namespace pscluster::scheduler {

v1::JobProgress InitialProgress(const std::vector<std::string>& workers) {
  v1::JobProgress p;
  p.set_test_accuracy(-1);
  p.set_test_loss(-1);
  p.set_eta_sec(-1);
  p.set_rolled_back_to_step(-1);
  for (size_t r = 0; r < workers.size(); ++r) {
    v1::WorkerProgress* w = p.add_workers();
    w->set_rank(r);
    w->set_node_id(workers[r]);
    w->set_test_accuracy(-1);
    w->set_test_loss(-1);
  }
  return p;
}

absl::Status CheckWorkerProgress(const v1::WorkerProgress& p, uint32_t num_workers) {
  auto bad = [](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("progress.", field, ": ", what));
  };
  if (p.rank() >= num_workers) {
    return bad("rank", absl::StrCat(p.rank(), " is not a rank of this job (it has ", num_workers,
                                    " workers)"));
  }
  if (p.step() < 0) return bad("step", "must be >= 0");
  if (p.total_steps() < 0) return bad("total_steps", "must be >= 0");
  const std::pair<const char*, double> rates[] = {{"samples_per_sec", p.samples_per_sec()},
                                                  {"pull_wait_sec", p.pull_wait_sec()},
                                                  {"compute_sec", p.compute_sec()},
                                                  {"push_sec", p.push_sec()},
                                                  {"compute_rate", p.compute_rate()}};
  for (const auto& [name, v] : rates) {
    if (!std::isfinite(v) || v < 0) return bad(name, "must be a finite number >= 0");
  }
  if (p.error().size() > 64 * 1024) return bad("error", "longer than 64 KiB");
  if (p.export_path().size() > 4096) return bad("export_path", "longer than 4096 bytes");
  return absl::OkStatus();
}

void Summarize(const v1::JobSpec& spec, const std::vector<uint32_t>& server_waiting_for,
               v1::JobProgress* p) {
  const int n = p->workers_size();
  p->clear_waiting_for();
  if (n == 0) return;
  int64_t min_step = INT64_MAX;
  int64_t min_total = 0;
  uint32_t min_epoch = UINT32_MAX;
  double loss_sum = 0, acc_sum = 0, sps = 0;
  int loss_n = 0, acc_n = 0;
  double eta = 0;
  bool eta_known = true;
  for (const v1::WorkerProgress& w : p->workers()) {
    if (w.left()) continue;  // Left the job: trains no more.
    if (w.step() < min_step) {
      min_step = w.step();
      min_total = w.total_steps();
    }
    min_epoch = std::min(min_epoch, w.epoch());
    if (w.updated_unix_ms() > 0) {
      loss_sum += w.loss();
      acc_sum += w.train_accuracy();
      ++loss_n;
      ++acc_n;
    }
    sps += w.samples_per_sec();
    if (w.done()) continue;
    int64_t left = std::max<int64_t>(0, w.total_steps() - w.step());
    if (w.total_steps() <= 0 || w.samples_per_sec() <= 0) {
      eta_known = false;
    } else {
      const uint32_t batch = w.batch_size() > 0 ? w.batch_size() : spec.batch_size();
      eta = std::max(eta, left * static_cast<double>(std::max(1u, batch)) / w.samples_per_sec());
    }
  }
  p->set_step(min_step == INT64_MAX ? 0 : min_step);
  p->set_total_steps(min_total);
  p->set_epoch(min_epoch == UINT32_MAX ? 0 : min_epoch);
  p->set_loss(loss_n > 0 ? loss_sum / loss_n : 0);
  p->set_train_accuracy(acc_n > 0 ? acc_sum / acc_n : 0);
  p->set_samples_per_sec(sps);
  p->set_eta_sec(eta_known ? eta : -1);

  // The latest evaluation: the evaluating rank's (the lowest that has not left the job) if it
  // has one, else the next rank's that has. A rank that left evaluates no more: what it last
  // reported is stale.
  p->set_test_accuracy(-1);
  p->set_test_loss(-1);
  for (const v1::WorkerProgress& w : p->workers()) {
    if (w.left()) continue;
    if (w.test_accuracy() >= 0) {
      p->set_test_accuracy(w.test_accuracy());
      p->set_test_loss(w.test_loss());
      break;
    }
  }

  // Who holds the others back: under BSP (s = 0) or SSP (s), a worker at step c can go on only
  // while the slowest has reached c - s. Only workers still training wait: a rank that reported
  // done (or that has completed all its steps) waits for no one and is waited for by no one.
  auto finished = [](const v1::WorkerProgress& w) {
    return w.done() || (w.total_steps() > 0 && w.step() >= w.total_steps());
  };
  std::set<uint32_t> waiting;
  if (spec.consistency().mode() != v1::ConsistencySpec::ASP) {
    int64_t s = spec.consistency().mode() == v1::ConsistencySpec::SSP
                    ? spec.consistency().staleness()
                    : 0;
    int64_t max_training_step = INT64_MIN;
    for (const v1::WorkerProgress& w : p->workers()) {
      if (!finished(w)) max_training_step = std::max(max_training_step, w.step());
    }
    for (const v1::WorkerProgress& w : p->workers()) {
      if (!w.done() && max_training_step != INT64_MIN && w.step() < max_training_step - s) {
        waiting.insert(w.rank());
      }
    }
    for (uint32_t r : server_waiting_for) {
      if (static_cast<int>(r) < n && !p->workers(r).done()) waiting.insert(r);
    }
  }
  for (uint32_t r : waiting) p->add_waiting_for(r);
}

}  // namespace pscluster::scheduler
