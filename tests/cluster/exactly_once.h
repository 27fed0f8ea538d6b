// The end-to-end tests' check that a job's updates were applied exactly once: the checkpoints
// its servers wrote at the last step count, per block, one update per worker and step.
#ifndef PSCLUSTER_TESTS_CLUSTER_EXACTLY_ONCE_H_
#define PSCLUSTER_TESTS_CLUSTER_EXACTLY_ONCE_H_

#include <string>

#include "proto/scheduler.pb.h"

namespace pscluster::testing {

// The newest checkpoint file of `server` in `dir` (empty if none).
std::string NewestCheckpoint(const std::string& dir, const std::string& server);

// Every dense block in the newest checkpoint of each of the job's servers (under `dir`, the
// job's checkpoint directory) was updated once per worker and step (two workers), as in a run
// that never stopped. Reports failures through gtest.
void ExpectEveryUpdateAppliedOnce(const std::string& dir, const v1::Job& job);

}  // namespace pscluster::testing

#endif  // PSCLUSTER_TESTS_CLUSTER_EXACTLY_ONCE_H_
