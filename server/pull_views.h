// Pull compression (CompressionSpec.pull_topk_ratio) on a server: for each worker and dense
// block it pulls, the values that worker holds (its "view", as the server last sent them), so
// that a pull sends only the elements whose value moved most since (top-k of the difference,
// with their indices) and the rest stay owed: what a pull does not send now, a later pull sends
// (error feedback on the server's side, as in DoubleSqueeze, Tang et al., ICML 2019).
//
// A view has an id that the worker sends back with its next pull (PushChunk.pull_view); a pull
// naming another id (a worker that never got the last reply, a new task, a server that
// restarted or took the shard over) gets the whole block, and the view starts again from it.
// Views are soft state: never checkpointed or copied to backups.
//
// Thread model: thread-safe. One mutex guards the index, one each view (taken after the index's
// when both are held); no I/O.
#ifndef PSCLUSTER_SERVER_PULL_VIEWS_H_
#define PSCLUSTER_SERVER_PULL_VIEWS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/compression_spec.h"
#include "proto/common.pb.h"
#include "server/memory_budget.h"

namespace pscluster {

class PullViews {
 public:
  // Views' values are charged to `budget` (a view that does not fit is not kept: that worker's
  // pulls of the block stay whole). REQUIRES: budget outlives this.
  explicit PullViews(MemoryBudget* budget);
  ~PullViews();
  PullViews(const PullViews&) = delete;
  PullViews& operator=(const PullViews&) = delete;

  struct Reply {
    std::string indices;  // Packed uint32 offsets of `values`; empty: the whole block.
    std::string values;   // Encoded in the pull's dtype.
    uint64_t view = 0;    // PullChunk.view (0: none kept).
  };
  // The reply to `worker`'s pull of dense block (`table`, `block`) whose float32 weights are now
  // w[0, n), the worker holding view `held` (PushChunk.pull_view; kPullViewStart or an unknown id:
  // the whole block). `ratio` is the table's pull_topk_ratio; values go as `dtype` (float32,
  // float16 or bfloat16), and the view keeps them as the worker decodes them.
  Reply Encode(uint32_t worker, uint32_t table, uint64_t block, uint64_t held, const float* w,
               uint64_t n, v1::DataType dtype, float ratio);
  // Forgets the views of blocks for which `keep(table, block)` is false (shards moved away).
  void DropUnless(const std::function<bool(uint32_t table, uint64_t block)>& keep);
  // Forgets every view of `worker` (a rank that left the job).
  void DropWorker(uint32_t worker);
  // Bytes of view values held.
  uint64_t bytes() const;

 private:
  struct View {
    explicit View(uint64_t n) : reserved(n * sizeof(float)) {}
    const uint64_t reserved;  // Bytes charged for it.
    absl::Mutex mu;
    uint64_t id ABSL_GUARDED_BY(mu) = 0;
    std::vector<float> values ABSL_GUARDED_BY(mu);
  };
  using Key = std::tuple<uint32_t, uint32_t, uint64_t>;  // (worker, table, block)
  uint64_t NextId();
  void DropIf(const std::function<bool(const Key&)>& drop);

  MemoryBudget* const budget_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, std::shared_ptr<View>> views_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> next_id_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_PULL_VIEWS_H_
