// Membership and partition arithmetic of a job's ranks: pure functions of the job's recovery
// record (proto/scheduler.proto JobRecovery: rank attempts, the ranks that left and who adopted
// their data, the data shares). The passes that hand ranks over, let them leave and rejoin, and
// balance data build every task and partition update with these.
#ifndef PSCLUSTER_SCHEDULER_MEMBERSHIP_H_
#define PSCLUSTER_SCHEDULER_MEMBERSHIP_H_

#include <cstdint>
#include <string>

#include "proto/scheduler.pb.h"
#include "proto/worker.pb.h"

namespace pscluster::scheduler {

// The attempt of `rank`'s current task (JobRecovery.rank_attempts; the job's recovery count for
// a rank without its own).
uint32_t RankAttempt(const v1::JobRecovery& recovery, uint32_t rank);
// An attempt above every rank's so far (of `num_workers` ranks).
uint32_t NextAttempt(const v1::JobRecovery& recovery, uint32_t num_workers);
// Gives `rank` a new attempt, above every rank's so far (filling in the per-rank list for
// ranks that had none), so that the servers can fence off any older task of it; returns it.
uint32_t StartNewAttempt(v1::JobRecovery* recovery, uint32_t rank, uint32_t num_workers);
// The rank that evaluates and exports: the lowest one that has not left the job (0 if all left).
uint32_t LeadRank(const v1::JobRecovery& recovery, uint32_t num_workers);
// The data partition of `rank`: its own part of `num_workers` (sized by the job's data shares,
// if any), and the parts of the ranks that left the job whose data it took over.
v1::DataPartition PartitionFor(const v1::JobRecovery& recovery, uint32_t rank,
                               uint32_t num_workers);
// What tells `rank`'s current task its partition, the lead rank and the ranks training.
v1::UpdatePartitionRequest PartitionUpdate(const std::string& job_id,
                                           const v1::JobRecovery& recovery, uint32_t rank,
                                           uint32_t num_workers);
// The task of `rank` in a job placed with `map` (what placement, hand-over and rejoin send).
v1::AssignTaskRequest TaskFor(const std::string& job_id, const v1::JobSpec& spec,
                              const v1::ShardMap& map, uint32_t rank, uint32_t num_workers,
                              const v1::JobRecovery& recovery);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_MEMBERSHIP_H_
