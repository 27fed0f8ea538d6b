// The argmax the CUDA softmax cross-entropy counts accuracy with, as one warp computes it: each
// lane scans its strided elements in increasing order, then the lanes combine in a butterfly.
// The answer equals the CPU backend's sequential scan `if (z[j] > max) take j` from z[0]:
//   * z[0] is NaN: 0 (nothing compares greater than the NaN the scan starts from);
//   * otherwise NaN elements are passed over, and the answer is the lowest index of the largest
//     of the others.
// Host and device code, so row_argmax_test.cc checks the lane/butterfly arrangement on the host
// against that scan; no CUDA headers.
#ifndef PSCLUSTER_KERNELS_CUDA_ROW_ARGMAX_H_
#define PSCLUSTER_KERNELS_CUDA_ROW_ARGMAX_H_

#include <cstdint>

#include "common/half_bits.h"  // PSCLUSTER_HOST_DEVICE.

namespace pscluster::kernels::argmax {

// A lane's candidate: the largest non-NaN value it has seen and its index, or none yet
// (index == none, where none is the row's length).
struct Candidate {
  float value;
  int64_t index;
};

PSCLUSTER_HOST_DEVICE inline Candidate None(int64_t classes) { return Candidate{0.0f, classes}; }

// The lane's scan: offer elements in increasing index order.
PSCLUSTER_HOST_DEVICE inline void Offer(Candidate* c, float v, int64_t j, int64_t classes) {
  if (v != v) return;  // NaN.
  if (c->index == classes || v > c->value) *c = Candidate{v, j};
}

// Combines two lanes' candidates: the larger value, the lower index on ties. Symmetric, so
// every lane of a butterfly ends with the same answer.
PSCLUSTER_HOST_DEVICE inline Candidate Better(Candidate a, Candidate b, int64_t classes) {
  if (b.index == classes) return a;
  if (a.index == classes) return b;
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// The row's answer from the combined candidate and the row's first element.
PSCLUSTER_HOST_DEVICE inline int64_t Finish(Candidate all, float z0, int64_t classes) {
  if (z0 != z0 || all.index == classes) return 0;
  return all.index;
}

}  // namespace pscluster::kernels::argmax

#endif  // PSCLUSTER_KERNELS_CUDA_ROW_ARGMAX_H_
