// The rules a job spec must satisfy before it is queued, and the defaults filled in after.
#ifndef PSCLUSTER_SCHEDULER_JOB_VALIDATION_H_
#define PSCLUSTER_SCHEDULER_JOB_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/limits.h"
#include "proto/job.pb.h"
#include "scheduler/job_source.h"

namespace pscluster::scheduler {

// Upper bounds that keep a typo from asking for absurd resources. What the servers themselves
// limit (workers, virtual shards, table sizes) is checked against common/limits.h, the constants
// the servers enforce.
inline constexpr uint32_t kMaxServers = 100000;
inline constexpr uint32_t kMaxGpusPerWorker = 64;

// Checks every field; the first violation is returned as INVALID_ARGUMENT naming the field (and
// its file and line when `where` knows them): "job.yaml:12: consistency.staleness: ...".
absl::Status ValidateJobSpec(const v1::JobSpec& spec, const JobSource& where);

// Fills the values the scheduler itself relies on: num_virtual_shards (0 -> 64),
// replication (0 -> 1), device ("" -> "auto").
// REQUIRES: ValidateJobSpec(*spec) is OK.
void ApplyJobDefaults(v1::JobSpec* spec);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_JOB_VALIDATION_H_
