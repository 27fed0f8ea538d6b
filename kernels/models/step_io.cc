#include "kernels/models/step_io.h"

#include <cstring>

#include "kernels/status_macros.h"

namespace pscluster::kernels {

absl::Status HostArray::Resize(Backend* backend, size_t n) {
  const size_t bytes = n * sizeof(float);
  if (bytes > buffer_.size()) {
    KERNELS_ASSIGN_OR_RETURN(Buffer grown, backend->AllocateHost(bytes + bytes / 2));
    if (size_ > 0) std::memcpy(grown.data(), buffer_.data(), size_ * sizeof(float));
    buffer_ = std::move(grown);
  }
  size_ = n;
  return absl::OkStatus();
}

void StepIO::Begin() {
  slots_.clear();
  device_bytes_ = staged_in_bytes_ = staged_out_bytes_ = out_offset_ = 0;
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

int StepIO::AddDeviceOutput(size_t bytes) {
  Slot s;
  s.device_only = true;
  s.bytes = bytes;
  slots_.push_back(s);
  return static_cast<int>(slots_.size()) - 1;
}

void StepIO::Layout() {
  // The arena: staged inputs, direct inputs, staged outputs, direct outputs; so one copy sends
  // the staged inputs and one brings the staged outputs back.
  size_t offset = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const bool input = pass < 2, staged = pass % 2 == 0;
    if (pass == 1) staged_in_bytes_ = offset;
    if (pass == 2) out_offset_ = offset;
    if (pass == 3) staged_out_bytes_ = offset - out_offset_;
    for (Slot& s : slots_) {
      if (s.input != input || s.Staged() != staged) continue;
      s.staged = staged;
      s.offset = offset;
      s.staging = input ? offset : staged_in_bytes_ + (offset - out_offset_);
      offset += AlignUp(s.bytes);
    }
  }
  device_bytes_ = offset;
}

absl::Status StepIO::Reserve(size_t device_bytes, size_t staging_bytes) {
  // No queued work reads the old buffers: a completed step ended with Download()'s synchronise
  // and Upload() drained one that failed in flight. (The CUDA backend would also free device
  // memory behind queued work and page-locked memory only once its stream is idle; this does
  // not lean on that.) Grow by half again to make regrowth rare.
  if (device_arena_.size() < device_bytes) {
    device_arena_.Reset();
    KERNELS_ASSIGN_OR_RETURN(device_arena_, backend_->Allocate(device_bytes + device_bytes / 2));
  }
  if (host_staging_.size() < staging_bytes) {
    host_staging_.Reset();
    KERNELS_ASSIGN_OR_RETURN(host_staging_,
                             backend_->AllocateHost(staging_bytes + staging_bytes / 2));
  }
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
  Layout();
  KERNELS_RETURN_IF_ERROR(Reserve(device_bytes_, staged_in_bytes_ + staged_out_bytes_));
  char* staging = host_staging_.as<char>();
  char* arena = device_arena_.as<char>();
  bool direct = false;
  for (Slot& s : slots_) {
    s.device = arena + s.offset;
    if (!s.input || s.bytes == 0) continue;
    if (s.staged) {
      std::memcpy(staging + s.staging, s.host_in, s.bytes);
    } else {
      direct = true;
    }
  }
  in_flight_ = true;
  KERNELS_RETURN_IF_ERROR(backend_->CopyToDevice(staging, arena, staged_in_bytes_));
  for (const Slot& s : slots_) {
    if (s.input && !s.staged) {
      KERNELS_RETURN_IF_ERROR(backend_->CopyToDevice(s.host_in, arena + s.offset, s.bytes));
    }
  }
  // A copy from page-locked memory reads it while it runs: wait, so that the caller may change
  // its memory once this returns (staged inputs are read from staging alone).
  return direct ? backend_->Synchronize() : absl::OkStatus();
}

void StepIO::AppendLayoutKey(std::vector<uint64_t>* key) const {
  const bool shared = backend_->shares_host_memory();
  key->push_back(slots_.size());
  if (!shared) key->push_back(reinterpret_cast<uintptr_t>(device_arena_.data()));
  for (const Slot& s : slots_) {
    key->push_back(uint64_t{s.bytes} << 2 | (s.device_only ? 2 : 0) | (s.input ? 1 : 0));
    if (shared) key->push_back(reinterpret_cast<uintptr_t>(s.device));
  }
}

absl::Status StepIO::Download() {
  if (backend_->shares_host_memory()) return backend_->Synchronize();
  char* staging = host_staging_.as<char>();
  char* arena = device_arena_.as<char>();
  KERNELS_RETURN_IF_ERROR(backend_->CopyToHost(arena + out_offset_, staging + staged_in_bytes_,
                                               staged_out_bytes_));
  for (const Slot& s : slots_) {
    if (!s.input && !s.staged && !s.device_only) {
      KERNELS_RETURN_IF_ERROR(backend_->CopyToHost(arena + s.offset, s.host_out, s.bytes));
    }
  }
  KERNELS_RETURN_IF_ERROR(backend_->Synchronize());
  in_flight_ = false;
  for (const Slot& s : slots_) {
    if (!s.input && s.staged && s.bytes > 0) {
      std::memcpy(s.host_out, staging + s.staging, s.bytes);
    }
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
