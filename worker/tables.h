// The parameter-server tables of a job: one TableSpec per model parameter, with the job's
// optimizer (or the table's override) and compression.
#ifndef PSCLUSTER_WORKER_TABLES_H_
#define PSCLUSTER_WORKER_TABLES_H_

#include <vector>

#include "absl/status/statusor.h"
#include "kernels/models/model.h"
#include "proto/job.pb.h"

namespace pscluster::worker {

// INVALID_ARGUMENT names a table_optimizers / table_compression key that matches no parameter,
// and a table_embedding key (a name, or "prefix/*" for every table under it) that matches no
// parameter or a dense one. A table takes its own table_compression entry, else the "*" entry
// (without its topk_ratio and quantize for a sparse table). A table takes its own table_embedding entry, else the longest
// "prefix/*" entry covering it.
// A COSINE learning-rate schedule without lr_decay_steps decays over `total_steps`, the job's
// steps per worker.
absl::StatusOr<std::vector<v1::TableSpec>> TableSpecsFor(const kernels::Model& model,
                                                         const v1::JobSpec& spec,
                                                         int64_t total_steps);

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_TABLES_H_
