#include "worker/auc.h"

#include <algorithm>
#include <cmath>

namespace pscluster::worker {

double AucAccumulator::Auc() {
  int64_t positives = 0;
  for (const Scored& e : examples_) {
    if (std::isnan(e.score)) return -1;
    positives += e.label == 1 ? 1 : 0;
  }
  const int64_t negatives = size() - positives;
  if (positives == 0 || negatives == 0) return -1;
  std::sort(examples_.begin(), examples_.end(),
            [](const Scored& a, const Scored& b) { return a.score < b.score; });
  // Sum of the positives' ranks (1-based), each run of equal scores at its average rank.
  double rank_sum = 0;
  for (size_t i = 0; i < examples_.size();) {
    size_t j = i;
    int64_t run_positives = 0;
    while (j < examples_.size() && examples_[j].score == examples_[i].score) {
      run_positives += examples_[j].label == 1 ? 1 : 0;
      ++j;
    }
    const double average_rank = 0.5 * static_cast<double>(i + 1 + j);  // Ranks i+1 .. j.
    rank_sum += average_rank * static_cast<double>(run_positives);
    i = j;
  }
  const double p = static_cast<double>(positives), q = static_cast<double>(negatives);
  return (rank_sum - p * (p + 1) / 2) / (p * q);
}

}  // namespace pscluster::worker
