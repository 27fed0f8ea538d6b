// Runs one step's ops plainly, records them as a graph, or replays a recording, on backends that
// record (Backend::records_graphs(): CUDA with BackendOptions::cuda_graphs). A step of a small
// model is a few dozen short kernels; launching them one by one costs more than running them.
//
// Recorded ops keep their arguments: buffer addresses, sizes, scalars. The caller's key must
// determine all of them (shapes, scalars, the base addresses of its buffers); the backend's
// memory_epoch() is added here. Per key:
//   * first seen: the ops run plainly (which grows every buffer, so a recording allocates
//     nothing);
//   * seen again: the ops are recorded, and the recording launched;
//   * afterwards: the recording is launched.
// At most `max_keys` keys are remembered (the least recently used is forgotten, with its
// recording). When a recording fails (the driver refuses, an op cannot be recorded), the step's
// ops run plainly; if they succeed so, the recording's failure is logged (once: nothing is
// recorded again), and if they fail, the step's error is returned and recording goes on.
//
// Thread model: not thread-safe; used by the model that owns it, on the model's thread.
#ifndef PSCLUSTER_KERNELS_MODELS_STEP_GRAPHS_H_
#define PSCLUSTER_KERNELS_MODELS_STEP_GRAPHS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace pscluster::kernels {

class StepGraphs {
 public:
  static constexpr size_t kDefaultMaxKeys = 32;

  struct Stats {
    int64_t plain = 0;     // Steps whose ops were queued one by one.
    int64_t captured = 0;  // Recordings made.
    int64_t replayed = 0;  // Steps run by launching a recording (a recording step included).
    int64_t forgotten = 0;  // Keys dropped to stay within max_keys.
  };

  // REQUIRES: backend outlives this object.
  explicit StepGraphs(Backend* backend, size_t max_keys = kDefaultMaxKeys);

  // True while steps may be recorded: the backend records and no recording has failed.
  bool enabled() const { return backend_->records_graphs() && failure_.ok(); }

  // Queues one step's ops: `enqueue` queues them on the backend (and may be called twice: once
  // recording, and once plainly when the recording failed), or a recording of them is launched.
  // Errors are enqueue's or the launch's; a failed recording is not one.
  absl::Status Run(std::vector<uint64_t> key, const std::function<absl::Status()>& enqueue);

  const Stats& stats() const { return stats_; }
  // Why recording stopped; OK while it has not.
  const absl::Status& failure() const { return failure_; }
  size_t graphs() const;  // Recordings held.

 private:
  struct Entry {
    std::unique_ptr<OpGraph> graph;  // Null until the key is seen a second time.
    uint64_t last_use = 0;
  };
  // Records the ops of `entry`'s key and launches them; falls back as the class comment says.
  absl::Status Capture(Entry* entry, const std::function<absl::Status()>& enqueue);
  void ForgetOldest();

  Backend* const backend_;
  const size_t max_keys_;
  std::map<std::vector<uint64_t>, Entry> entries_;
  uint64_t clock_ = 0;
  Stats stats_;
  absl::Status failure_;
};

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_MODELS_STEP_GRAPHS_H_
