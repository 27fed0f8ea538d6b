// Double-buffered device copies of a step's parameters, so that the next step's parameters
// travel to the device on the backend's upload stream (backend.h) while the current step
// computes on the op stream.
//
// Two sets, each a device arena and a page-locked staging buffer (grown, never shrunk).
// Prefetch() uploads into the set the latest step did not read: small tensors packed in the
// staging buffer and sent in one copy, large ones straight from the caller's memory. Take()
// gives the step being queued the set that holds exactly its parameters (the same host memory)
// and makes the op stream wait for that upload. Release(), after the step's ops are queued,
// marks where the op stream is done with the set: a later upload into it waits for that point
// on the device, and the host waits for a set's previous upload before it refills the set's
// staging buffer. So the parameters a queued step reads are never overwritten under it, and no
// step reads parameters before they have arrived.
//
// On a backend that shares host memory (CPU) there is nothing to upload: Prefetch() does
// nothing and Take() finds nothing.
//
// Thread model: not thread-safe; used by the model that owns it, on the model's thread.
#ifndef PSCLUSTER_KERNELS_MODELS_PARAM_PREFETCH_H_
#define PSCLUSTER_KERNELS_MODELS_PARAM_PREFETCH_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"

namespace pscluster::kernels {

class ParamPrefetch {
 public:
  using Values = std::vector<absl::Span<const float>>;

  // REQUIRES: backend outlives this object.
  explicit ParamPrefetch(Backend* backend) : backend_(backend) {}

  // Queues the upload of `values` and returns; replaces a prefetch that no step took.
  // REQUIRES: the memory of `values` stays valid and unchanged until the step that takes them
  // has been waited for, or until the next Prefetch() or Drop() returns.
  absl::Status Prefetch(const Values& values);
  // Whether a prefetch waits for the step that takes it.
  bool pending() const { return pending_ >= 0; }
  // When the pending prefetch is of exactly `values` (each span's data() and size()): makes the
  // op stream wait for its upload, sets `device` to the tensors' device addresses (indexed like
  // `values`) and returns true; the set is then the current one. Otherwise false, and the
  // prefetch stays pending.
  absl::StatusOr<bool> Take(const Values& values, std::vector<const float*>* device);
  // After the ops of the step that took the current set were queued (also when queuing them
  // failed): the set may be overwritten once the op stream has run them.
  absl::Status Release();
  // Forgets the pending prefetch (its upload may have failed), after waiting for its upload
  // (ignoring errors: they were or will be reported by the step that failed).
  void Drop();
  // What the current set's device addresses depend on: its arena's address and each tensor's
  // size. For keying recorded graphs (step_graphs.h). REQUIRES: Take() returned true.
  void AppendLayoutKey(std::vector<uint64_t>* key) const;

  int64_t prefetched() const { return prefetched_; }  // Prefetch() calls that queued an upload.
  int64_t taken() const { return taken_; }            // Take() calls that returned true.

 private:
  struct Set {
    Buffer arena;    // Device.
    Buffer staging;  // Host, page-locked on CUDA.
    Event uploaded;  // Upload stream: after the set's latest upload.
    Event released;  // Op stream: after the ops of the latest step that read the set.
    Values values;   // The host memory of the latest upload.
    std::vector<size_t> offsets, bytes;  // Per tensor, in the arena.
  };
  absl::Status Upload(Set* set, const Values& values);

  Backend* const backend_;
  Set sets_[2];
  bool events_made_ = false;
  int pending_ = -1;  // The set holding a prefetch no step took.
  int current_ = -1;  // The set of the latest step that took one.
  int64_t prefetched_ = 0;
  int64_t taken_ = 0;
};

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_MODELS_PARAM_PREFETCH_H_
