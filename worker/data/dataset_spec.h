// A job's `dataset:` section (pscluster.v1.DatasetSpec) as the streaming reader's options: the
// user's files, as opposed to a built-in data set. The scheduler checks a job with it at
// submission and the worker opens the data with it, so both read the keys the same way.
#ifndef PSCLUSTER_WORKER_DATA_DATASET_SPEC_H_
#define PSCLUSTER_WORKER_DATA_DATASET_SPEC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "worker/data/dataset_options.h"

namespace pscluster::data {

// Whether the spec names the user's files (`format`) rather than a built-in set (`name`).
inline bool IsStreamed(const v1::DatasetSpec& spec) { return !spec.format().empty(); }

// The options of a streamed data set, defaults filled in and checked (Validate). `job_seed`
// stands in for a seed of 0. INVALID_ARGUMENT names the key, prefixed with "dataset."; keys of
// the built-in sets (name, path, hash_bits, num_examples, zipf_exponent) are refused.
// REQUIRES: IsStreamed(spec).
absl::StatusOr<DatasetOptions> DatasetOptionsOf(const v1::DatasetSpec& spec, uint64_t job_seed);

// The most keys a categorical field, a libsvm set or all fields together may use
// (num_features, hash_buckets, buckets): 0 when unbounded (libsvm without num_features).
uint64_t KeySpaceOf(const DatasetOptions& options);

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_DATASET_SPEC_H_
