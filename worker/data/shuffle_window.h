// A shuffle window: examples go in in reading order and come out in a random order, each held
// at most until `capacity` later ones have gone in. Deterministic for a seed. Examples move by
// swapping, so the window's vectors are reused and it allocates only while it fills.
// Thread-compatible.
#ifndef PSCLUSTER_WORKER_DATA_SHUFFLE_WINDOW_H_
#define PSCLUSTER_WORKER_DATA_SHUFFLE_WINDOW_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/data/example.h"

namespace pscluster::data {

class ShuffleWindow {
 public:
  // capacity 0 or 1: examples come out as they go in.
  ShuffleWindow(size_t capacity, uint64_t seed);

  // Takes *e. True when an example comes out: then *e holds it. False while the window fills
  // (then *e holds an empty example to reuse).
  bool Push(Example* e);

  // Takes out one of the held examples, chosen at random, into *e; false when none is held.
  bool Drain(Example* e);

  size_t size() const { return size_; }

 private:
  size_t Random(size_t n);

  const size_t capacity_;
  std::vector<Example> slots_;
  size_t size_ = 0;
  uint64_t state_;
};

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_SHUFFLE_WINDOW_H_
