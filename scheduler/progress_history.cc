#include "scheduler/progress_history.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/job_state.h"

namespace pscluster::scheduler {

void ProgressHistory::Observe(const v1::Job& job, absl::Time now) {
  const int64_t unix_ms = absl::ToUnixMillis(now);
  ObserveEvents(job, unix_ms);
  ObservePoint(job, unix_ms);
}

void ProgressHistory::ObservePoint(const v1::Job& job, int64_t unix_ms) {
  const v1::JobProgress& p = job.progress();
  // Nothing reported yet (queued, placing, or running before the first report).
  bool reported = false;
  for (const v1::WorkerProgress& w : p.workers()) reported |= w.updated_unix_ms() > 0;
  if (!reported) return;
  v1::ProgressPoint point;
  point.set_unix_ms(unix_ms);
  point.set_step(p.step());
  point.set_loss(p.loss());
  point.set_train_accuracy(p.train_accuracy());
  point.set_test_accuracy(p.test_accuracy());
  point.set_test_loss(p.test_loss());
  // The evaluating rank's AUC, as psctl picks it: the lowest rank still in the job that has
  // evaluated (a rank that has not reports 0, not -1).
  double auc = -1;
  for (const v1::WorkerProgress& w : p.workers()) {
    if (w.left() || w.test_accuracy() < 0) continue;
    auc = w.test_auc();
    break;
  }
  point.set_test_auc(auc);
  point.set_samples_per_sec(p.samples_per_sec());

  if (history_.step_spacing() == 0) history_.set_step_spacing(1);
  auto* points = history_.mutable_points();
  if (points->empty()) {
    *points->Add() = std::move(point);
    anchor_step_ = p.step();
    tail_provisional_ = false;
    return;
  }
  if (!tail_provisional_ && points->rbegin()->step() == p.step()) {
    *points->rbegin() = std::move(point);  // Another rank's report of the same step: fresher.
    return;
  }
  const int64_t spacing = history_.step_spacing();
  const bool keep = p.step() < anchor_step_ || p.step() >= anchor_step_ + spacing;
  if (tail_provisional_) {
    *points->Mutable(points->size() - 1) = std::move(point);
  } else {
    *points->Add() = std::move(point);
  }
  tail_provisional_ = !keep;
  if (keep) anchor_step_ = p.step();
  if (points->size() > kMaxPoints) Downsample();
}

void ProgressHistory::Downsample() {
  auto* points = history_.mutable_points();
  google::protobuf::RepeatedPtrField<v1::ProgressPoint> kept;
  const int last = points->size() - 1;
  for (int i = 0; i < last; i += 2) *kept.Add() = std::move(*points->Mutable(i));
  *kept.Add() = std::move(*points->Mutable(last));  // The latest look stays.
  points->Swap(&kept);
  history_.set_step_spacing(history_.step_spacing() * 2);
}

void ProgressHistory::AddEvent(int64_t unix_ms, v1::JobEventKind kind, int64_t step,
                               std::string text) {
  auto* events = history_.mutable_events();
  if (events->size() >= kMaxEvents) {
    events->erase(events->begin());
    history_.set_events_dropped(history_.events_dropped() + 1);
  }
  v1::JobEvent* e = events->Add();
  e->set_unix_ms(unix_ms);
  e->set_kind(kind);
  e->set_step(step);
  e->set_text(std::move(text));
}

void ProgressHistory::ObserveEvents(const v1::Job& job, int64_t unix_ms) {
  const v1::JobRecovery& r = job.recovery();
  const int64_t step = job.progress().step();
  if (!seen_ || job.state() != state_) {
    AddEvent(unix_ms, v1::JOB_EVENT_STATE, step,
             job.reason().empty() ? JobStateName(job.state())
                                  : absl::StrCat(JobStateName(job.state()), ": ", job.reason()));
  }
  if (!seen_) {
    // The first look (a new job, or a scheduler that restarted): what happened before is in the
    // job's counters, not repeated as events.
    seen_ = true;
    state_ = job.state();
    recoveries_ = r.recoveries();
    handovers_ = r.handovers();
    promotions_ = r.promotions();
    left_ = r.left_size();
    rejoins_ = r.rejoins();
    rebalances_ = r.rebalances();
    for (const v1::ShardMove& m : job.moves()) {
      moves_finished_ms_ = std::max(moves_finished_ms_, m.finished_unix_ms());
    }
    return;
  }
  state_ = job.state();
  if (r.recoveries() > recoveries_) {
    AddEvent(unix_ms, v1::JOB_EVENT_ROLLBACK, r.start_step(),
             absl::StrCat("rolled back to step ", r.start_step(), ": ", r.last_cause()));
  }
  if (r.handovers() > handovers_) {
    AddEvent(unix_ms, v1::JOB_EVENT_HANDOVER, step,
             absl::StrCat("rank handed to another worker: ", r.last_cause()));
  }
  if (r.promotions() > promotions_) {
    AddEvent(unix_ms, v1::JOB_EVENT_PROMOTION, step,
             absl::StrCat("backups took over: ", r.last_cause()));
  }
  for (int i = left_; i < r.left_size(); ++i) {
    const v1::LeftRank& l = r.left(i);
    AddEvent(unix_ms, v1::JOB_EVENT_RANK_LEFT, step,
             absl::StrCat("rank ", l.rank(), " left (", l.node_id(), ": ", l.cause(), "); rank ",
                          l.adopted_by(), " reads its data"));
  }
  if (r.rejoins() > rejoins_) {
    AddEvent(unix_ms, v1::JOB_EVENT_RANK_REJOINED, step,
             absl::StrCat(r.rejoins() - rejoins_, " rank(s) rejoined"));
  }
  if (r.rebalances() > rebalances_) {
    AddEvent(unix_ms, v1::JOB_EVENT_DATA_BALANCE, step,
             absl::StrCat("data shares ", absl::StrJoin(r.data_shares(), ",")));
  }
  int64_t newest = moves_finished_ms_;
  for (const v1::ShardMove& m : job.moves()) {
    if (m.finished_unix_ms() <= moves_finished_ms_) continue;
    newest = std::max(newest, m.finished_unix_ms());
    const bool done = m.state() == v1::MOVE_DONE;
    AddEvent(unix_ms, v1::JOB_EVENT_SHARD_MOVE, step,
             absl::StrCat("shard ", m.shard(), " ", m.from(), " -> ", m.to(),
                          done ? " done" : " failed", m.result().empty() ? "" : ": ", m.result()));
  }
  moves_finished_ms_ = newest;
  recoveries_ = r.recoveries();
  handovers_ = r.handovers();
  promotions_ = r.promotions();
  left_ = r.left_size();  // A rollback clears the list: later departures count from there.
  rejoins_ = r.rejoins();
  rebalances_ = r.rebalances();
}

}  // namespace pscluster::scheduler
