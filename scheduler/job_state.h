// The job lifecycle: queued -> placing -> running -> succeeded / failed / cancelled.
//
//   QUEUED  -> PLACING (resources found), CANCELLED, FAILED (cannot ever be placed)
//   PLACING -> RUNNING (every server and worker accepted), QUEUED (a node refused; retried),
//              FAILED, CANCELLED
//   RUNNING -> SUCCEEDED (every rank done), FAILED (a worker error or a lost node), CANCELLED
// The three final states never change.
#ifndef PSCLUSTER_SCHEDULER_JOB_STATE_H_
#define PSCLUSTER_SCHEDULER_JOB_STATE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"

namespace pscluster::scheduler {

bool IsTerminal(v1::JobState state);
// Queued, placing or running.
bool IsActive(v1::JobState state);
// Holds servers and workers (placing or running).
bool HoldsResources(v1::JobState state);

// OK when `from` -> `to` is a lifecycle edge; FAILED_PRECONDITION naming both states otherwise.
absl::Status CheckTransition(v1::JobState from, v1::JobState to);

// "queued", "placing", "running", "succeeded", "failed", "cancelled".
std::string JobStateName(v1::JobState state);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_JOB_STATE_H_
