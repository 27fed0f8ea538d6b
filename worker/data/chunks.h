// A rank's part of a data set as chunks of its files, and the order it reads them in an epoch.
//
// The set is the concatenation of its files in path order. A partition (partition.h: part
// `index` of `count`, sized by `shares`, plus the parts in `also` of ranks that left) takes:
//  - split "files": the files [F*S(a)/S, F*S(a+1)/S) of part a, whole;
//  - split "bytes": the bytes [B*S(a)/S, B*S(a+1)/S) of the concatenation (B its size), each
//    plain file's share cut at chunk_bytes; a line belongs to the range holding its first byte,
//    and a gzip file, which cannot be cut, to the range holding the file's first byte.
// An explicit range [begin, end) of the spec counts files or bytes the same way. Either way the
// parts of any spec cover every line of the set exactly once, so an epoch over all ranks reads
// the set once.
#ifndef PSCLUSTER_WORKER_DATA_CHUNKS_H_
#define PSCLUSTER_WORKER_DATA_CHUNKS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/data_files.h"
#include "worker/data/dataset_options.h"
#include "worker/data/partition.h"

namespace pscluster::data {

// The lines of layout.files[file] that start in [begin, end) (a whole file: [0, size)).
struct Chunk {
  uint32_t file = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint32_t part = 0;  // The partition part it belongs to (the spec's index, or one of `also`).

  bool operator==(const Chunk& o) const {
    return file == o.file && begin == o.begin && end == o.end && part == o.part;
  }
};

// "auto" made concrete: files when the set has at least as many files as the spec's parts.
SplitMode ResolveSplit(const DataLayout& layout, const PartitionSpec& spec, SplitMode split);

// The chunks of one part `a` of the spec (a == spec.index for an explicit range), in file
// order. REQUIRES: CheckPartition(spec) is OK; a < spec.count; chunk_bytes > 0.
std::vector<Chunk> ChunksOfPart(const DataLayout& layout, const PartitionSpec& spec, uint32_t a,
                                SplitMode split, uint64_t chunk_bytes);

// The chunks of the spec: its part (or range), then the parts in `also`. INVALID_ARGUMENT
// naming the field when the spec does not fit the set, or a part holds no data (more parts than
// files, or gzip files too few to give every part one).
absl::StatusOr<std::vector<Chunk>> PartChunks(const DataLayout& layout, const PartitionSpec& spec,
                                              SplitMode split, uint64_t chunk_bytes);

// The chunks in the order one epoch reads them: the same for the same (seed, epoch, part), a
// different permutation per epoch.
std::vector<Chunk> EpochChunkOrder(std::vector<Chunk> chunks, uint64_t seed, uint32_t epoch);

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_CHUNKS_H_
