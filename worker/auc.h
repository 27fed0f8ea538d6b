// The area under the ROC curve of a two-class model's scores, exact: the probability that a
// random positive example scores above a random negative one, ties counting one half
// (the Mann-Whitney U statistic over the average ranks).
#ifndef PSCLUSTER_WORKER_AUC_H_
#define PSCLUSTER_WORKER_AUC_H_

#include <cstdint>
#include <vector>

namespace pscluster::worker {

// Scores and labels (0 or 1) of every example, gathered over a whole test pass.
class AucAccumulator {
 public:
  void Add(float score, int32_t label) { examples_.push_back({score, label}); }
  int64_t size() const { return static_cast<int64_t>(examples_.size()); }
  // The exact AUC; -1 when the examples lack either class (or hold a NaN score).
  // Sorts the examples: O(n log n).
  double Auc();

 private:
  struct Scored {
    float score;
    int32_t label;
  };
  std::vector<Scored> examples_;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_AUC_H_
