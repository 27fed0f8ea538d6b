#include "worker/param_slots.h"

#include <utility>

namespace pscluster::worker {

absl::Status PrepareSlot(const kernels::Model& model, kernels::Backend* backend,
                         std::vector<std::vector<uint64_t>> keys, ParamSlot* slot) {
  const auto& params = model.params();
  slot->keys = std::move(keys);
  slot->values.resize(params.size());
  slot->grads.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    size_t n = params[i].sparse ? slot->keys[i].size() * params[i].row_width
                                : static_cast<size_t>(params[i].num_elements());
    absl::Status s = slot->values[i].Resize(backend, n);
    if (s.ok()) s = slot->grads[i].Resize(backend, n);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

PullTargets TargetsOf(const kernels::Model& model, ParamSlot* slot, bool dense, bool sparse) {
  PullTargets t;
  const auto& params = model.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].sparse && sparse) {
      t.sparse.push_back({params[i].name, slot->keys[i], slot->values[i].data()});
    } else if (!params[i].sparse && dense) {
      t.dense.push_back({params[i].name, slot->values[i].data()});
    }
  }
  return t;
}

PushSources SourcesOf(const kernels::Model& model, const ParamSlot& slot) {
  PushSources s;
  const auto& params = model.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].sparse) {
      s.sparse.push_back({params[i].name, slot.keys[i], slot.grads[i].data()});
    } else {
      s.dense.push_back({params[i].name, slot.grads[i].data()});
    }
  }
  return s;
}

kernels::ParamValues ValuesOf(const ParamSlot& slot) {
  kernels::ParamValues pv;
  for (size_t i = 0; i < slot.values.size(); ++i) {
    pv.values.push_back(slot.values[i]);
    pv.keys.push_back(slot.keys[i]);
  }
  return pv;
}

kernels::Gradients GradientsOf(ParamSlot* slot) {
  kernels::Gradients g;
  for (auto& v : slot->grads) g.values.push_back(absl::MakeSpan(v));
  return g;
}

}  // namespace pscluster::worker
