// The job lifecycle: queued -> placing -> running -> succeeded / failed / cancelled.
//
//   QUEUED  -> PLACING (resources found), CANCELLED, FAILED (cannot ever be placed)
//   PLACING -> RUNNING (every server and worker accepted), QUEUED (a node refused; retried),
//              FAILED, CANCELLED
//   RUNNING -> SUCCEEDED (every rank done), FAILED (a worker error, or a lost node when the job
//              may not recover), CANCELLED, RECOVERING (a lost node)
//   RECOVERING -> QUEUED (rolled back to its newest complete checkpoint; placed again),
//              FAILED (no recovery possible), CANCELLED
// The three final states never change.
#ifndef PSCLUSTER_SCHEDULER_JOB_STATE_H_
#define PSCLUSTER_SCHEDULER_JOB_STATE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"

namespace pscluster::scheduler {

bool IsTerminal(v1::JobState state);
// Queued, placing, running or recovering.
bool IsActive(v1::JobState state);
// Holds servers and workers (placing, running, or recovering: its old nodes until stopped).
bool HoldsResources(v1::JobState state);

// OK when `from` -> `to` is a lifecycle edge; FAILED_PRECONDITION naming both states otherwise.
absl::Status CheckTransition(v1::JobState from, v1::JobState to);

// "queued", "placing", "running", "succeeded", "failed", "cancelled", "recovering".
std::string JobStateName(v1::JobState state);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_JOB_STATE_H_
