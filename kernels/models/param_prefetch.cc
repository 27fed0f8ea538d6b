#include "kernels/models/param_prefetch.h"

#include <cstring>

#include "kernels/models/step_io.h"
#include "kernels/status_macros.h"

namespace pscluster::kernels {

absl::Status ParamPrefetch::Prefetch(const Values& values) {
  if (backend_->shares_host_memory()) return absl::OkStatus();
  if (!events_made_) {
    for (Set& s : sets_) {
      KERNELS_ASSIGN_OR_RETURN(s.uploaded, backend_->CreateEvent());
      KERNELS_ASSIGN_OR_RETURN(s.released, backend_->CreateEvent());
    }
    events_made_ = true;
  }
  // Into the set the latest step did not read (the pending prefetch's, when there is one).
  Set& set = sets_[current_ == 0 ? 1 : 0];
  pending_ = -1;
  absl::Status queued = Upload(&set, values);
  if (!queued.ok()) return queued;
  pending_ = current_ == 0 ? 1 : 0;
  ++prefetched_;
  return absl::OkStatus();
}

absl::Status ParamPrefetch::Upload(Set* set, const Values& values) {
  // The set's previous upload may still read its staging buffer and the caller's memory.
  KERNELS_RETURN_IF_ERROR(backend_->WaitForEvent(set->uploaded));
  set->values.clear();
  // Layout: the staged tensors first (one copy sends them), then those sent directly.
  const size_t count = values.size();
  set->offsets.assign(count, 0);
  set->bytes.assign(count, 0);
  size_t offset = 0, staged_bytes = 0;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) staged_bytes = offset;
    for (size_t i = 0; i < count; ++i) {
      const size_t bytes = values[i].size() * sizeof(float);
      if ((bytes < StepIO::kDirectBytes) != (pass == 0)) continue;
      set->offsets[i] = offset;
      set->bytes[i] = bytes;
      offset += AlignUp(bytes);
    }
  }
  // Growing frees the old memory behind the work queued to use it (backend.h, Buffer).
  if (set->arena.size() < offset) {
    set->arena.Reset();
    KERNELS_ASSIGN_OR_RETURN(set->arena, backend_->Allocate(offset + offset / 2));
  }
  if (set->staging.size() < staged_bytes) {
    set->staging.Reset();
    KERNELS_ASSIGN_OR_RETURN(set->staging,
                             backend_->AllocateHost(staged_bytes + staged_bytes / 2));
  }
  char* arena = set->arena.as<char>();
  char* staging = set->staging.as<char>();
  for (size_t i = 0; i < count; ++i) {
    if (set->bytes[i] > 0 && set->offsets[i] < staged_bytes) {
      std::memcpy(staging + set->offsets[i], values[i].data(), set->bytes[i]);
    }
  }
  // On the device: not before the op stream is done with the set's previous step.
  KERNELS_RETURN_IF_ERROR(backend_->WaitEvent(Stream::kUpload, set->released));
  KERNELS_RETURN_IF_ERROR(backend_->CopyToDeviceAsync(staging, arena, staged_bytes));
  for (size_t i = 0; i < count; ++i) {
    if (set->offsets[i] >= staged_bytes) {
      KERNELS_RETURN_IF_ERROR(
          backend_->CopyToDeviceAsync(values[i].data(), arena + set->offsets[i], set->bytes[i]));
    }
  }
  KERNELS_RETURN_IF_ERROR(backend_->RecordEvent(Stream::kUpload, set->uploaded));
  set->values = values;
  return absl::OkStatus();
}

absl::StatusOr<bool> ParamPrefetch::Take(const Values& values, std::vector<const float*>* device) {
  if (pending_ < 0) return false;
  Set& set = sets_[pending_];
  if (values.size() != set.values.size()) return false;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i].data() != set.values[i].data() || values[i].size() != set.values[i].size()) {
      return false;
    }
  }
  KERNELS_RETURN_IF_ERROR(backend_->WaitEvent(Stream::kOps, set.uploaded));
  char* arena = set.arena.as<char>();
  device->assign(values.size(), nullptr);
  for (size_t i = 0; i < values.size(); ++i) {
    if (arena != nullptr) (*device)[i] = reinterpret_cast<const float*>(arena + set.offsets[i]);
  }
  current_ = pending_;
  pending_ = -1;
  ++taken_;
  return true;
}

absl::Status ParamPrefetch::Release() {
  if (current_ < 0) return absl::OkStatus();
  return backend_->RecordEvent(Stream::kOps, sets_[current_].released);
}

void ParamPrefetch::Drop() {
  if (pending_ < 0) return;
  backend_->WaitForEvent(sets_[pending_].uploaded).IgnoreError();
  sets_[pending_].values.clear();
  pending_ = -1;
}

void ParamPrefetch::AppendLayoutKey(std::vector<uint64_t>* key) const {
  const Set& set = sets_[current_];
  key->push_back(reinterpret_cast<uintptr_t>(set.arena.data()));
  key->push_back(set.bytes.size());
  for (size_t b : set.bytes) key->push_back(b);
}

}  // namespace pscluster::kernels
