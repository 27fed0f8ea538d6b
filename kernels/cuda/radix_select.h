// The digit-selection step of the CUDA top-k's radix select (cuda_topk.cu), written as the phases
// one block of kRadixDigits threads runs between its barriers. The kernel calls them with
// __syncthreads() in between; radix_select_test.cc runs the same functions on the host, phase by
// phase, in any thread order the hardware could choose, so a read that races a write of another
// thread shows up there as a wrong answer. Plain C++ (no CUDA headers) where nvcc is absent.
#ifndef PSCLUSTER_KERNELS_CUDA_RADIX_SELECT_H_
#define PSCLUSTER_KERNELS_CUDA_RADIX_SELECT_H_

#include <cstdint>

#include "common/half_bits.h"  // PSCLUSTER_HOST_DEVICE, AbsKey.

namespace pscluster::kernels::radix {

constexpr int kRadixDigits = 256;  // 8 bits a pass, four passes over a 32-bit key.

// The selection's progress, in device memory between the kernels of one TopKAbs call.
struct TopKState {
  uint32_t prefix;     // Key bits decided so far.
  uint32_t mask;       // Which bits those are.
  uint32_t remaining;  // How many of the keys matching `prefix` must still be taken.
  uint32_t pad;
  uint32_t hist[kRadixDigits];  // This pass's digit counts among the keys matching `prefix`.
};

// What one thread keeps in registers across the block's barriers.
struct DigitThread {
  uint32_t remaining = 0;  // state.remaining as it was when the kernel started.
  uint32_t add = 0;        // The scan's addend for the current step.
};

// Phase 0: thread t loads its digit's count and the state it decides from.
// REQUIRES: nothing in this kernel has written `state` yet. The deciding thread rewrites
// state.remaining in the last phase, so a thread that read it any later could see the new value
// and pick a second, wrong digit.
PSCLUSTER_HOST_DEVICE inline void DigitLoad(int t, const TopKState& state, uint32_t* suffix,
                                            DigitThread* r) {
  r->remaining = state.remaining;
  suffix[t] = state.hist[t];
}

// The scan turns suffix[t] into the number of keys whose digit is >= t. Each of its steps
// (step = 1, 2, 4, ..., 128) is two phases: every thread reads, then every thread adds.
PSCLUSTER_HOST_DEVICE inline void DigitScanRead(int t, int step, const uint32_t* suffix,
                                                DigitThread* r) {
  r->add = t + step < kRadixDigits ? suffix[t + step] : 0u;
}
PSCLUSTER_HOST_DEVICE inline void DigitScanAdd(int t, uint32_t* suffix, const DigitThread& r) {
  suffix[t] += r.add;
}

// True when digit t holds the remaining-th largest key: at least `remaining` keys have a digit
// >= t, fewer have a digit > t. Exactly one digit does when 1 <= remaining <= suffix[0].
PSCLUSTER_HOST_DEVICE inline bool DigitHoldsRank(int t, const uint32_t* suffix,
                                                 uint32_t remaining) {
  const uint32_t above = t + 1 < kRadixDigits ? suffix[t + 1] : 0u;
  return suffix[t] >= remaining && above < remaining;
}

// Last phase: the thread whose digit holds the rank narrows the state to that digit.
PSCLUSTER_HOST_DEVICE inline void DigitDecide(int t, int shift, const uint32_t* suffix,
                                              const DigitThread& r, TopKState* state) {
  if (!DigitHoldsRank(t, suffix, r.remaining)) return;
  const uint32_t above = t + 1 < kRadixDigits ? suffix[t + 1] : 0u;
  state->remaining = r.remaining - above;
  state->prefix |= static_cast<uint32_t>(t) << shift;
  state->mask |= 0xffu << shift;
}

}  // namespace pscluster::kernels::radix

#endif  // PSCLUSTER_KERNELS_CUDA_RADIX_SELECT_H_
