// Moves one step's host inputs to the device and its outputs back.
//
// On a backend that shares host memory (CPU) nothing is copied: device(slot) is the host memory
// itself. Otherwise small inputs (under kDirectBytes) are packed into a page-locked staging
// buffer and sent with one CopyToDevice, and larger ones are copied straight from the caller's
// memory: when that memory is page-locked (a HostArray's), the copy is a DMA transfer with no
// staging copy on the host. Outputs come back the same way. Device and staging buffers persist
// across steps and only grow.
#ifndef PSCLUSTER_KERNELS_MODELS_STEP_IO_H_
#define PSCLUSTER_KERNELS_MODELS_STEP_IO_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace pscluster::kernels {

// A growable float array in host memory from a backend's AllocateHost (page-locked on CUDA):
// what a worker keeps a step's parameters and gradients in, so that StepIO copies them without
// staging. Keeps its contents when it grows. Move-only; must not outlive its backend.
class HostArray {
 public:
  HostArray() = default;

  // Sizes the array to n floats (growing the allocation, by half again, when needed).
  absl::Status Resize(Backend* backend, size_t n);
  float* data() const { return buffer_.as<float>(); }
  size_t size() const { return size_; }
  float* begin() const { return data(); }
  float* end() const { return data() + size_; }
  float& operator[](size_t i) const { return data()[i]; }

 private:
  Buffer buffer_;
  size_t size_ = 0;
};

class StepIO {
 public:
  // Inputs and outputs of at least this many bytes are copied without staging.
  static constexpr size_t kDirectBytes = size_t{64} << 10;

  explicit StepIO(Backend* backend) : backend_(backend) {}

  // Forgets the previous step's slots.
  void Begin();
  // Registers host memory; returns a slot id. REQUIRES: the memory stays valid until Download()
  // (outputs) or Upload() (inputs) returns.
  int AddInput(const void* host, size_t bytes);
  int AddOutput(void* host, size_t bytes);
  // Device memory for an output that the caller copies back itself (Download() leaves it).
  // REQUIRES: !backend->shares_host_memory() (there, give the host memory to AddOutput).
  int AddDeviceOutput(size_t bytes);
  // Sends every input; when some went without staging, waits for the copies, so the caller's
  // memory is free again on return either way. After it, device(slot) is valid for inputs and
  // outputs until Begin().
  absl::Status Upload();
  void* device(int slot) const { return slots_[slot].device; }
  // What every device(slot) depends on, appended to `key`: the arena's address and each slot's
  // kind and size (on a backend that shares host memory, each slot's address too). For
  // keying recorded graphs (step_graphs.h). REQUIRES: Upload() ran since Begin().
  void AppendLayoutKey(std::vector<uint64_t>* key) const;
  // Waits for the device's work (the op stream), then copies every output but device-only ones
  // to its host memory.
  absl::Status Download();

 private:
  struct Slot {
    bool input = false;
    bool device_only = false;  // AddDeviceOutput.
    bool Staged() const { return bytes < kDirectBytes && !device_only; }
    const void* host_in = nullptr;
    void* host_out = nullptr;
    size_t bytes = 0;
    size_t offset = 0;  // In the device arena.
    bool staged = false;
    size_t staging = 0;  // In the staging buffer, when staged.
    void* device = nullptr;
  };
  void Layout();
  absl::Status Reserve(size_t device_bytes, size_t staging_bytes);

  Backend* backend_;
  std::vector<Slot> slots_;
  size_t device_bytes_ = 0;
  // Staged inputs lie first in the arena and in staging ([0, staged_in_bytes_)); staged outputs
  // lie together from out_offset_ in the arena and from staged_in_bytes_ in staging.
  size_t staged_in_bytes_ = 0;
  size_t staged_out_bytes_ = 0;
  size_t out_offset_ = 0;
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
