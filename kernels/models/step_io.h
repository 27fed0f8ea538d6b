// Moves one step's host inputs to the device and its outputs back, one copy each way.
//
// On a backend that shares host memory (CPU) nothing is copied: device(slot) is the host memory
// itself. Otherwise inputs are packed into a page-locked staging buffer and sent with one
// CopyToDevice; outputs come back with one CopyToHost and are unpacked. Device and staging
// buffers persist across steps and only grow.
#ifndef PSCLUSTER_KERNELS_MODELS_STEP_IO_H_
#define PSCLUSTER_KERNELS_MODELS_STEP_IO_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace pscluster::kernels {

class StepIO {
 public:
  explicit StepIO(Backend* backend) : backend_(backend) {}

  // Forgets the previous step's slots.
  void Begin();
  // Registers host memory; returns a slot id. REQUIRES: the memory stays valid until Download()
  // (outputs) or Upload() (inputs) returns.
  int AddInput(const void* host, size_t bytes);
  int AddOutput(void* host, size_t bytes);
  // Sends every input. After it, device(slot) is valid for inputs and outputs until Begin().
  absl::Status Upload();
  void* device(int slot) const { return slots_[slot].device; }
  // Waits for the device's work, then copies every output to its host memory.
  absl::Status Download();

 private:
  struct Slot {
    bool input = false;
    const void* host_in = nullptr;
    void* host_out = nullptr;
    size_t bytes = 0;
    size_t offset = 0;  // In the arena (inputs first, then outputs).
    void* device = nullptr;
  };
  absl::Status Reserve(size_t bytes);

  Backend* backend_;
  std::vector<Slot> slots_;
  size_t input_bytes_ = 0;
  size_t total_bytes_ = 0;
  bool in_flight_ = false;  // Upload() ran and Download() has not completed since.
  Buffer device_arena_;
  Buffer host_staging_;
};

// Device memory for a step's intermediate tensors, grown to the largest step seen.
class Workspace {
 public:
  explicit Workspace(Backend* backend) : backend_(backend) {}
  // REQUIRES: no queued work uses the old memory when it grows, unless the backend frees in
  // stream order (CUDA does; the CPU backend queues nothing).
  absl::Status Reserve(size_t bytes);
  char* base() const { return buffer_.as<char>(); }

 private:
  Backend* backend_;
  Buffer buffer_;
};

// Rounds up to the 256-byte alignment every tensor in an arena gets.
inline size_t AlignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_MODELS_STEP_IO_H_
