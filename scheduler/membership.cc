#include "scheduler/membership.h"

#include <algorithm>

namespace pscluster::scheduler {

uint32_t RankAttempt(const v1::JobRecovery& recovery, uint32_t rank) {
  return static_cast<int>(rank) < recovery.rank_attempts_size() ? recovery.rank_attempts(rank)
                                                                : recovery.recoveries();
}

uint32_t NextAttempt(const v1::JobRecovery& recovery, uint32_t num_workers) {
  uint32_t top = recovery.recoveries();
  for (uint32_t r = 0; r < num_workers; ++r) top = std::max(top, RankAttempt(recovery, r));
  for (uint32_t a : recovery.rank_attempts()) top = std::max(top, a);
  return top + 1;
}

uint32_t StartNewAttempt(v1::JobRecovery* recovery, uint32_t rank, uint32_t num_workers) {
  const uint32_t next = NextAttempt(*recovery, num_workers);
  while (static_cast<uint32_t>(recovery->rank_attempts_size()) < num_workers) {
    recovery->add_rank_attempts(RankAttempt(*recovery, recovery->rank_attempts_size()));
  }
  recovery->set_rank_attempts(rank, next);
  return next;
}

v1::AssignTaskRequest TaskFor(const std::string& job_id, const v1::JobSpec& spec,
                              const v1::ShardMap& map, uint32_t rank, uint32_t num_workers,
                              const v1::JobRecovery& recovery) {
  v1::AssignTaskRequest req;
  req.set_job_id(job_id);
  *req.mutable_spec() = spec;
  req.set_rank(rank);
  req.set_num_workers(num_workers);
  *req.mutable_partition() = PartitionFor(recovery, rank, num_workers);
  *req.mutable_shard_map() = map;
  req.set_start_step(recovery.start_step());
  req.set_attempt(RankAttempt(recovery, rank));
  req.set_lead_rank(LeadRank(recovery, num_workers));
  req.set_training_ranks(num_workers - std::min<uint32_t>(num_workers, recovery.left_size()));
  return req;
}

v1::DataPartition PartitionFor(const v1::JobRecovery& recovery, uint32_t rank,
                               uint32_t num_workers) {
  v1::DataPartition p;
  p.set_index(rank);
  p.set_count(num_workers);
  if (recovery.data_shares_size() == static_cast<int>(num_workers)) {
    *p.mutable_shares() = recovery.data_shares();
  }
  for (const v1::LeftRank& l : recovery.left()) {
    if (l.adopted_by() == rank && l.rank() != rank) p.add_also(l.rank());
  }
  return p;
}

v1::UpdatePartitionRequest PartitionUpdate(const std::string& job_id,
                                           const v1::JobRecovery& recovery, uint32_t rank,
                                           uint32_t num_workers) {
  v1::UpdatePartitionRequest up;
  up.set_job_id(job_id);
  up.set_rank(rank);
  up.set_attempt(RankAttempt(recovery, rank));
  *up.mutable_partition() = PartitionFor(recovery, rank, num_workers);
  up.set_lead_rank(LeadRank(recovery, num_workers));
  up.set_training_ranks(num_workers - std::min<uint32_t>(num_workers, recovery.left_size()));
  return up;
}

uint32_t LeadRank(const v1::JobRecovery& recovery, uint32_t num_workers) {
  for (uint32_t r = 0; r < num_workers; ++r) {
    bool left = false;
    for (const v1::LeftRank& l : recovery.left()) left = left || l.rank() == r;
    if (!left) return r;
  }
  return 0;
}

}  // namespace pscluster::scheduler
