#include "kernels/models/step_graphs.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pscluster::kernels {

StepGraphs::StepGraphs(Backend* backend, size_t max_keys)
    : backend_(backend), max_keys_(max_keys < 1 ? 1 : max_keys) {}

size_t StepGraphs::graphs() const {
  size_t n = 0;
  for (const auto& [key, entry] : entries_) n += entry.graph != nullptr;
  return n;
}

absl::Status StepGraphs::Run(std::vector<uint64_t> key,
                             const std::function<absl::Status()>& enqueue) {
  if (!enabled()) {
    ++stats_.plain;
    return enqueue();
  }
  key.push_back(backend_->memory_epoch());
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (entries_.size() >= max_keys_) ForgetOldest();
    entries_[std::move(key)].last_use = ++clock_;
    ++stats_.plain;
    return enqueue();
  }
  Entry& entry = it->second;
  entry.last_use = ++clock_;
  if (entry.graph == nullptr) return Capture(&entry, enqueue);
  ++stats_.replayed;
  return entry.graph->Launch();
}

absl::Status StepGraphs::Capture(Entry* entry, const std::function<absl::Status()>& enqueue) {
  absl::Status why = backend_->BeginCapture();
  if (why.ok()) {
    absl::Status queued = enqueue();
    // Always ended, so that the backend runs ops again.
    absl::StatusOr<std::unique_ptr<OpGraph>> graph = backend_->EndCapture();
    if (!queued.ok()) {
      why = queued;
    } else if (!graph.ok()) {
      why = graph.status();
    } else {
      entry->graph = std::move(*graph);
      ++stats_.captured;
      ++stats_.replayed;
      return entry->graph->Launch();
    }
  }
  // Nothing recorded has run: run the step plainly. When that fails too, the step itself is at
  // fault (its error is returned); otherwise recording is, and stops.
  ++stats_.plain;
  absl::Status plain = enqueue();
  if (!plain.ok()) return plain;
  failure_ = why;
  entries_.clear();
  Logger("kernels")->warn("recording a step as a graph failed on {}; steps run op by op from now "
                          "on: {}",
                          backend_->name(), why.ToString());
  return absl::OkStatus();
}

void StepGraphs::ForgetOldest() {
  auto oldest = entries_.begin();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->second.last_use < oldest->second.last_use) oldest = it;
  }
  // A recording still running on the device is freed when it completes (OpGraph's contract on
  // CUDA: cudaGraphExecDestroy does not wait).
  entries_.erase(oldest);
  ++stats_.forgotten;
}

}  // namespace pscluster::kernels
