// A job's progress from its workers' reports: the slowest worker's step, mean loss, summed
// throughput, ETA and, under BSP/SSP, which ranks the others are waiting for.
#ifndef PSCLUSTER_SCHEDULER_PROGRESS_H_
#define PSCLUSTER_SCHEDULER_PROGRESS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "proto/job.pb.h"
#include "proto/scheduler.pb.h"

namespace pscluster::scheduler {

// A fresh progress for a job of `num_workers` ranks placed on `workers` (node ids by rank):
// nothing done, evaluations and ETA unknown (-1).
v1::JobProgress InitialProgress(const std::vector<std::string>& workers);

// Checks a worker's report: rank in range, counters >= 0, rates finite and >= 0. Loss and
// accuracy may be anything a diverging model produces (NaN included). INVALID_ARGUMENT names the
// field ("progress.step").
absl::Status CheckWorkerProgress(const v1::WorkerProgress& p, uint32_t num_workers);

// Recomputes the summary fields of `*progress` from progress->workers() and the ranks that the
// servers report as holding parked pulls back (`server_waiting_for`). Keeps
// rolled_back_to_step.
void Summarize(const v1::JobSpec& spec, const std::vector<uint32_t>& server_waiting_for,
               v1::JobProgress* progress);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_PROGRESS_H_
