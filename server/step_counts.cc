#include "server/step_counts.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pscluster {

StepCounts::StepCounts(uint64_t elems) : elems_(elems), runs_{{elems, 0}} {}

void StepCounts::Advance(uint64_t offset, uint64_t n,
                         absl::FunctionRef<void(uint64_t, uint64_t, int64_t)> f) {
  if (n == 0) return;
  const uint64_t stop = offset + n;
  if (!per_elem_.empty()) {
    for (uint64_t i = offset; i < stop; ++i) ++per_elem_[i];
    for (uint64_t i = offset; i < stop;) {
      uint64_t j = i + 1;
      while (j < stop && per_elem_[j] == per_elem_[i]) ++j;
      f(i, j - i, per_elem_[i]);
      i = j;
    }
    return;
  }
  // Cut the runs at offset and stop so that whole runs cover [offset, stop).
  auto split_at = [this](uint64_t pos) {
    uint64_t start = 0;
    for (size_t i = 0; i < runs_.size(); ++i) {
      if (pos > start && pos < runs_[i].end) {
        runs_.insert(runs_.begin() + i, Run{pos, runs_[i].steps});
        return;
      }
      start = runs_[i].end;
    }
  };
  split_at(offset);
  split_at(stop);
  uint64_t start = 0;
  for (Run& r : runs_) {
    if (start >= offset && r.end <= stop) {
      ++r.steps;
      f(start, r.end - start, r.steps);
    }
    start = r.end;
  }
  MaybeMerge();
}

void StepCounts::MaybeMerge() {
  std::vector<Run> merged;
  merged.reserve(runs_.size());
  for (const Run& r : runs_) {
    if (!merged.empty() && merged.back().steps == r.steps) {
      merged.back().end = r.end;
    } else {
      merged.push_back(r);
    }
  }
  runs_.swap(merged);
  if (runs_.size() <= kMaxRuns) return;
  per_elem_.resize(elems_);
  uint64_t start = 0;
  for (const Run& r : runs_) {
    std::fill(per_elem_.begin() + start, per_elem_.begin() + r.end, r.steps);
    start = r.end;
  }
  runs_.clear();
}

int64_t StepCounts::max() const {
  int64_t m = 0;
  if (!per_elem_.empty()) {
    for (int64_t s : per_elem_) m = std::max(m, s);
    return m;
  }
  for (const Run& r : runs_) m = std::max(m, r.steps);
  return m;
}

bool StepCounts::uniform() const {
  if (!per_elem_.empty()) {
    return std::all_of(per_elem_.begin(), per_elem_.end(),
                       [&](int64_t s) { return s == per_elem_[0]; });
  }
  return runs_.size() <= 1;
}

std::vector<StepCounts::Run> StepCounts::Runs() const {
  if (per_elem_.empty()) return runs_;
  std::vector<Run> out;
  for (uint64_t i = 0; i < elems_; ++i) {
    if (!out.empty() && out.back().steps == per_elem_[i]) {
      out.back().end = i + 1;
    } else {
      out.push_back(Run{i + 1, per_elem_[i]});
    }
  }
  return out;
}

void StepCounts::SetUniform(int64_t steps) {
  per_elem_.clear();
  per_elem_.shrink_to_fit();
  runs_.assign(1, Run{elems_, steps});
}

absl::Status StepCounts::SetRuns(const std::vector<Run>& runs) {
  if (runs.empty()) return absl::InvalidArgumentError("step_runs: empty");
  uint64_t start = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].end <= start) {
      return absl::InvalidArgumentError(absl::StrCat("step_runs[", i, "].end: ", runs[i].end,
                                                     " does not follow ", start));
    }
    if (runs[i].steps < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step_runs[", i, "].steps: ", runs[i].steps, " is negative"));
    }
    start = runs[i].end;
  }
  if (start != elems_) {
    return absl::InvalidArgumentError(
        absl::StrCat("step_runs: end at ", start, ", the block has ", elems_, " elements"));
  }
  per_elem_.clear();
  per_elem_.shrink_to_fit();
  runs_ = runs;
  MaybeMerge();
  return absl::OkStatus();
}

}  // namespace pscluster
