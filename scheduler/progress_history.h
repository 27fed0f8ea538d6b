// A job's progress over time and what happened to it (v1::JobHistory), kept by the scheduler
// for the status RPC (Job.history) and the web status page.
//
// The scheduler shows the recorder every published version of the job (after each progress
// report and each write of the job); the recorder samples a progress point and turns what changed
// since the last look (state, recovery counters, finished shard moves, data shares) into events.
// Bounded: at most kMaxPoints points, spread evenly over the whole run (when full, every second
// point goes and points are taken half as often), and kMaxEvents events (the oldest go).
//
// Not thread-safe: the scheduler keeps one per job under its lock.
#ifndef PSCLUSTER_SCHEDULER_PROGRESS_HISTORY_H_
#define PSCLUSTER_SCHEDULER_PROGRESS_HISTORY_H_

#include <cstdint>

#include "absl/time/time.h"
#include "proto/scheduler.pb.h"

namespace pscluster::scheduler {

class ProgressHistory {
 public:
  static constexpr int kMaxPoints = 1000;
  static constexpr int kMaxEvents = 200;

  // Looks at `job` as published at `now`.
  void Observe(const v1::Job& job, absl::Time now);

  // Points oldest first; the last one is the latest look at a job with progress.
  const v1::JobHistory& history() const { return history_; }

 private:
  void ObservePoint(const v1::Job& job, int64_t unix_ms);
  void ObserveEvents(const v1::Job& job, int64_t unix_ms);
  void AddEvent(int64_t unix_ms, v1::JobEventKind kind, int64_t step, std::string text);
  void Downsample();

  v1::JobHistory history_;
  // The step of the last point kept for good; a point within step_spacing of it is provisional
  // (replaced by the next look) so that the latest point is always there.
  int64_t anchor_step_ = 0;
  bool tail_provisional_ = false;
  // What the previous look saw.
  bool seen_ = false;
  v1::JobState state_ = v1::JOB_STATE_UNSPECIFIED;
  uint32_t recoveries_ = 0;
  uint32_t handovers_ = 0;
  uint32_t promotions_ = 0;
  int left_ = 0;
  uint32_t rejoins_ = 0;
  uint32_t rebalances_ = 0;
  int64_t moves_finished_ms_ = 0;  // Newest finished_unix_ms of a move already recorded.
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_PROGRESS_HISTORY_H_
