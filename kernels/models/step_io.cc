#include "kernels/models/step_io.h"

#include <cstring>

#include "kernels/status_macros.h"

namespace pscluster::kernels {

void StepIO::Begin() {
  slots_.clear();
  input_bytes_ = 0;
  total_bytes_ = 0;
}

int StepIO::AddInput(const void* host, size_t bytes) {
  Slot s;
  s.input = true;
  s.host_in = host;
  s.bytes = bytes;
  slots_.push_back(s);
  return static_cast<int>(slots_.size()) - 1;
}

int StepIO::AddOutput(void* host, size_t bytes) {
  Slot s;
  s.host_out = host;
  s.bytes = bytes;
  slots_.push_back(s);
  return static_cast<int>(slots_.size()) - 1;
}

absl::Status StepIO::Reserve(size_t bytes) {
  if (device_arena_.size() >= bytes) return absl::OkStatus();
  // No queued work reads the old buffers: a completed step ended with Download()'s synchronise
  // and Upload() drained one that failed in flight. (The CUDA backend would also free device
  // memory behind queued work and page-locked memory only once its stream is idle; this does
  // not lean on that.) Grow by half again to make regrowth rare.
  device_arena_.Reset();
  host_staging_.Reset();
  const size_t want = bytes + bytes / 2;
  KERNELS_ASSIGN_OR_RETURN(device_arena_, backend_->Allocate(want));
  KERNELS_ASSIGN_OR_RETURN(host_staging_, backend_->AllocateHost(want));
  return absl::OkStatus();
}

absl::Status StepIO::Upload() {
  if (backend_->shares_host_memory()) {
    for (Slot& s : slots_) s.device = s.input ? const_cast<void*>(s.host_in) : s.host_out;
    return absl::OkStatus();
  }
  if (in_flight_) {
    // The previous step failed between Upload() and Download(): its copies may still read the
    // staging buffer. Its error was already returned; wait and start clean.
    backend_->Synchronize().IgnoreError();
    in_flight_ = false;
  }
  // Inputs first, so one contiguous copy sends them all; outputs after, to come back in one.
  size_t offset = 0;
  for (Slot& s : slots_) {
    if (!s.input) continue;
    s.offset = offset;
    offset += AlignUp(s.bytes);
  }
  input_bytes_ = offset;
  for (Slot& s : slots_) {
    if (s.input) continue;
    s.offset = offset;
    offset += AlignUp(s.bytes);
  }
  total_bytes_ = offset;
  KERNELS_RETURN_IF_ERROR(Reserve(total_bytes_));
  char* staging = host_staging_.as<char>();
  char* arena = device_arena_.as<char>();
  for (Slot& s : slots_) {
    s.device = arena + s.offset;
    if (s.input && s.bytes > 0) std::memcpy(staging + s.offset, s.host_in, s.bytes);
  }
  in_flight_ = true;
  return backend_->CopyToDevice(staging, arena, input_bytes_);
}

absl::Status StepIO::Download() {
  if (backend_->shares_host_memory()) return backend_->Synchronize();
  const size_t out_bytes = total_bytes_ - input_bytes_;
  KERNELS_RETURN_IF_ERROR(backend_->CopyToHost(device_arena_.as<char>() + input_bytes_,
                                               host_staging_.as<char>() + input_bytes_,
                                               out_bytes));
  KERNELS_RETURN_IF_ERROR(backend_->Synchronize());
  in_flight_ = false;
  const char* staging = host_staging_.as<char>();
  for (const Slot& s : slots_) {
    if (!s.input && s.bytes > 0) std::memcpy(s.host_out, staging + s.offset, s.bytes);
  }
  return absl::OkStatus();
}

absl::Status Workspace::Reserve(size_t bytes) {
  if (buffer_.size() >= bytes) return absl::OkStatus();
  buffer_.Reset();  // Freed behind queued work on CUDA (stream-ordered), at once on the CPU.
  KERNELS_ASSIGN_OR_RETURN(buffer_, backend_->Allocate(bytes + bytes / 2));
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
