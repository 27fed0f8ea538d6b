// The model of a job trained in this process with no parameter server: batch -> TrainStep -> the
// servers' own update code (server/optimizer.h) on host buffers. The baseline the training
// benchmarks divide by (training_bench, netsim_training_bench).
#ifndef PSCLUSTER_TESTS_BENCH_ONE_PROCESS_TRAINING_H_
#define PSCLUSTER_TESTS_BENCH_ONE_PROCESS_TRAINING_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/job.pb.h"
#include "worker/data/fashion_mnist.h"

namespace pscluster::bench {

struct OneProcessResult {
  double samples_per_sec = 0;
  double compute_sec_per_step = 0;  // TrainStep alone.
  double test_accuracy = -1;
  int64_t samples = 0;
  absl::Time start, end;  // The training loop (not the evaluation).
};

// Trains `spec` (its model on Fashion-MNIST, input 784 and 10 classes; its optimizer, batch size,
// epochs and seed) on the CPU backend with `cpu_threads` (0 = all cores), then evaluates it on the
// test split.
absl::StatusOr<OneProcessResult> TrainInOneProcess(const v1::JobSpec& spec,
                                                   const data::FashionMnist& fm, int cpu_threads);

}  // namespace pscluster::bench

#endif  // PSCLUSTER_TESTS_BENCH_ONE_PROCESS_TRAINING_H_
