#include "scheduler/job_state.h"

#include "absl/strings/str_cat.h"

namespace pscluster::scheduler {

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_SUCCEEDED || s == v1::JOB_FAILED || s == v1::JOB_CANCELLED;
}

bool IsActive(v1::JobState s) {
  return s == v1::JOB_QUEUED || s == v1::JOB_PLACING || s == v1::JOB_RUNNING ||
         s == v1::JOB_RECOVERING;
}

bool HoldsResources(v1::JobState s) {
  return s == v1::JOB_PLACING || s == v1::JOB_RUNNING || s == v1::JOB_RECOVERING;
}

absl::Status CheckTransition(v1::JobState from, v1::JobState to) {
  bool ok = false;
  switch (from) {
    case v1::JOB_QUEUED:
      ok = to == v1::JOB_PLACING || to == v1::JOB_CANCELLED || to == v1::JOB_FAILED;
      break;
    case v1::JOB_PLACING:
      ok = to == v1::JOB_RUNNING || to == v1::JOB_QUEUED || to == v1::JOB_FAILED ||
           to == v1::JOB_CANCELLED;
      break;
    case v1::JOB_RUNNING:
      ok = to == v1::JOB_SUCCEEDED || to == v1::JOB_FAILED || to == v1::JOB_CANCELLED ||
           to == v1::JOB_RECOVERING;
      break;
    case v1::JOB_RECOVERING:
      ok = to == v1::JOB_QUEUED || to == v1::JOB_FAILED || to == v1::JOB_CANCELLED;
      break;
    default:
      ok = false;
  }
  if (ok) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "a job cannot go from ", JobStateName(from), " to ", JobStateName(to),
      IsTerminal(from) ? " (it has already finished)" : ""));
}

std::string JobStateName(v1::JobState s) {
  switch (s) {
    case v1::JOB_QUEUED:
      return "queued";
    case v1::JOB_PLACING:
      return "placing";
    case v1::JOB_RUNNING:
      return "running";
    case v1::JOB_SUCCEEDED:
      return "succeeded";
    case v1::JOB_FAILED:
      return "failed";
    case v1::JOB_CANCELLED:
      return "cancelled";
    case v1::JOB_RECOVERING:
      return "recovering";
    default:
      return "unspecified";
  }
}

}  // namespace pscluster::scheduler
