#include "server/worker_clocks.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pscluster {

WorkerClocks::WorkerClocks(std::string job_id, uint32_t num_workers)
    : job_id_(std::move(job_id)),
      clocks_(num_workers, 0),
      fences_(num_workers, 0),
      left_(num_workers, false) {}

std::vector<uint32_t> WorkerClocks::LeftWorkers() const {
  std::vector<uint32_t> out;
  for (uint32_t w = 0; w < left_.size(); ++w) {
    if (left_[w]) out.push_back(w);
  }
  return out;
}

int64_t WorkerClocks::Min() const {
  int64_t m = std::numeric_limits<int64_t>::max();
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (!left_[w]) m = std::min(m, clocks_[w]);
  }
  return m == std::numeric_limits<int64_t>::max() ? 0 : m;
}

int64_t WorkerClocks::MinOfOthers(uint32_t worker) const {
  int64_t m = std::numeric_limits<int64_t>::max();
  for (uint32_t w = 0; w < clocks_.size(); ++w) {
    if (w != worker && !left_[w]) m = std::min(m, clocks_[w]);
  }
  return m;
}

int64_t WorkerClocks::Max() const {
  int64_t m = 0;
  for (int64_t c : clocks_) m = std::max(m, c);
  return m;
}

void WorkerClocks::ObservePush(uint32_t worker, int64_t step) {
  if (!Unknown(worker)) return;
  clocks_[worker] = std::max(clocks_[worker], step);
  unknown_[worker] = false;
}

bool WorkerClocks::Complete(uint32_t worker, int64_t step) {
  if (clocks_[worker] >= step + 1) return false;
  const int64_t before = Min();
  clocks_[worker] = step + 1;
  return Min() != before;
}

void WorkerClocks::MarkUnknown() { unknown_.assign(clocks_.size(), true); }

void WorkerClocks::Join(const std::vector<int64_t>& other) {
  for (uint32_t w = 0; w < clocks_.size() && w < other.size(); ++w) {
    clocks_[w] = Unknown(w) ? other[w] : std::min(clocks_[w], other[w]);
    if (w < unknown_.size()) unknown_[w] = false;
  }
}

void WorkerClocks::SetAll(int64_t step) {
  unknown_.clear();
  for (int64_t& c : clocks_) c = step;
}

void WorkerClocks::Set(uint32_t worker, int64_t clock) {
  if (worker < clocks_.size()) clocks_[worker] = clock;
}

void WorkerClocks::SetEach(const std::vector<int64_t>& clocks) {
  for (uint32_t w = 0; w < clocks_.size() && w < clocks.size(); ++w) clocks_[w] = clocks[w];
  unknown_.clear();
}

std::pair<int64_t, uint32_t> WorkerClocks::Fence(uint32_t worker, uint32_t attempt) {
  if (worker >= fences_.size()) return {-1, 0};
  fences_[worker] = std::max(fences_[worker], attempt);
  return {clocks_[worker], fences_[worker]};
}

void WorkerClocks::FenceAll(uint32_t attempt) {
  for (uint32_t& f : fences_) f = std::max(f, attempt);
}

absl::Status WorkerClocks::CheckAttempt(uint32_t worker, uint32_t attempt,
                                        absl::string_view field) const {
  if (worker >= fences_.size() || attempt >= fences_[worker]) return absl::OkStatus();
  if (left_[worker]) {
    return absl::AbortedError(absl::StrCat(field, ": rank ", worker, " has left job '", job_id_,
                                           "' (its worker was lost); this task must stop"));
  }
  return absl::AbortedError(absl::StrCat(
      field, ": rank ", worker, " of job '", job_id_, "' was handed to a newer task (attempt ",
      fences_[worker], "); this task (attempt ", attempt, ") was replaced and must stop"));
}

absl::Status WorkerClocks::CheckRank(uint32_t worker, absl::string_view field) const {
  if (worker < left_.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": rank ", worker, " is outside job '",
                                                 job_id_, "' (", left_.size(), " workers)"));
}

absl::StatusOr<int64_t> WorkerClocks::Leave(uint32_t worker, bool* newly) {
  *newly = false;
  absl::Status st = CheckRank(worker, "worker");
  if (!st.ok()) return st;
  if (left_[worker]) return clocks_[worker];
  size_t staying = 0;
  for (bool l : left_) staying += l ? 0 : 1;
  if (staying <= 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker: rank ", worker, " is the last rank of job '", job_id_, "' and cannot leave it"));
  }
  left_[worker] = true;
  fences_[worker] = std::numeric_limits<uint32_t>::max();
  *newly = true;
  return clocks_[worker];
}

absl::StatusOr<int64_t> WorkerClocks::Rejoin(uint32_t worker, uint32_t attempt) {
  absl::Status st = CheckRank(worker, "worker");
  if (!st.ok()) return st;
  if (!left_[worker]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rejoin: rank ", worker, " of job '", job_id_, "' has not left it"));
  }
  const int64_t clock = Min();  // Of the others: this one is still out.
  left_[worker] = false;
  clocks_[worker] = clock;
  fences_[worker] = attempt;
  return clock;
}

}  // namespace pscluster
