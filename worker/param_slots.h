// The buffers one training step's parameters and gradients live in, and the pull targets, push
// sources and model views over them.
//
// A task rotates three slots: step n computes with slot n % 3 while the pull of step n + 1 and
// the push of step n - 1 use the other two. Values and gradients live in the backend's host
// memory (page-locked on CUDA), so the model copies them to and from the device without staging.
//
// Thread model: a slot is used by one thread at a time (the task thread hands it to the pull or
// push thread and waits for it back).
#ifndef PSCLUSTER_WORKER_PARAM_SLOTS_H_
#define PSCLUSTER_WORKER_PARAM_SLOTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/models/model.h"
#include "kernels/models/step_io.h"
#include "server/client/param_client.h"

namespace pscluster::worker {

struct ParamSlot {
  std::vector<std::vector<uint64_t>> keys;  // Per parameter (sparse only).
  std::vector<kernels::HostArray> values;   // Per parameter.
  std::vector<kernels::HostArray> grads;    // Per parameter.
};

// Sizes the slot's buffers for `keys` (one list per parameter; keeping what the buffers hold)
// for `model`'s parameters. REQUIRES: model and backend outlive the slot's use.
absl::Status PrepareSlot(const kernels::Model& model, kernels::Backend* backend,
                         std::vector<std::vector<uint64_t>> keys, ParamSlot* slot);

// Pull targets over the slot: the dense parameters, the sparse ones, or both.
PullTargets TargetsOf(const kernels::Model& model, ParamSlot* slot, bool dense, bool sparse);

// Push sources over the slot's gradients.
PushSources SourcesOf(const kernels::Model& model, const ParamSlot& slot);

// The model's views of the slot.
kernels::ParamValues ValuesOf(const ParamSlot& slot);
kernels::Gradients GradientsOf(ParamSlot* slot);

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_PARAM_SLOTS_H_
