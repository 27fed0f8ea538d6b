// The optimizer-apply part of ps_bench: Adam over a 16 MiB float32 gradient through the kernel
// (ApplyUpdate) and through the table path (DenseTable::ApplyPayload from a payload received in
// 64 KiB pieces), beside a single-thread memcpy of the gradient measured in the same runs.
#ifndef PSCLUSTER_TESTS_BENCH_APPLY_BENCH_H_
#define PSCLUSTER_TESTS_BENCH_APPLY_BENCH_H_

namespace pscluster::bench {

struct ApplyResult {
  double memcpy_bw = 0;  // Bytes/s, single thread, 16 MiB buffers.
  double kernel = 0;     // Gradient bytes/s through ApplyUpdate (Adam) on float arrays.
  double table = 0;      // Through DenseTable::ApplyPayload from a received payload.
  double kernel_ratio = 0, table_ratio = 0;  // Medians of the per-run ratios to memcpy.
};

// memcpy, the kernel and the table path, interleaved run by run: `runs` measured runs after one
// warm-up; medians.
ApplyResult BenchApply(int runs);

}  // namespace pscluster::bench

#endif  // PSCLUSTER_TESTS_BENCH_APPLY_BENCH_H_
