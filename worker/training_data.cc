#include "worker/training_data.h"

#include <algorithm>

namespace pscluster::worker {

data::PartitionSpec PartitionSpecOf(const v1::DataPartition& p, uint32_t rank,
                                    uint32_t num_workers) {
  data::PartitionSpec part;
  part.index = p.count() > 0 ? p.index() : rank;
  part.count = p.count() > 0 ? p.count() : num_workers;
  part.begin = p.begin();
  part.end = p.end();
  part.also.assign(p.also().begin(), p.also().end());
  part.shares.assign(p.shares().begin(), p.shares().end());
  return part;
}

Schedule ScheduleFor(int64_t train_size, uint32_t parts, uint32_t batch, uint32_t epochs) {
  Schedule s;
  const int64_t smallest_part = train_size / std::max(1u, parts);
  s.steps_per_epoch = std::max<int64_t>(1, smallest_part / std::max(1u, batch));
  s.total_steps = s.steps_per_epoch * epochs;
  return s;
}

int64_t RankBatch(const data::PartitionSpec& part, uint32_t job_batch, int64_t examples) {
  // Never more than its partition in one step (shares sent by a caller other than the scheduler
  // could ask for any size), nor less than the job's batch when that is larger.
  return std::min<int64_t>(data::RankBatch(part, job_batch),
                           std::max<int64_t>(job_batch, examples));
}

}  // namespace pscluster::worker
