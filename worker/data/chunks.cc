#include "worker/data/chunks.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sharding.h"

namespace pscluster::data {
namespace {

void AddPieces(uint32_t file, uint64_t begin, uint64_t end, uint32_t part, uint64_t chunk_bytes,
               std::vector<Chunk>* out) {
  for (uint64_t b = begin; b < end;) {
    const uint64_t e = end - b > chunk_bytes ? b + chunk_bytes : end;
    out->push_back({file, b, e, part});
    b = e;
  }
}

}  // namespace

SplitMode ResolveSplit(const DataLayout& layout, const PartitionSpec& spec, SplitMode split) {
  if (split != SplitMode::kAuto) return split;
  return layout.files.size() >= spec.count ? SplitMode::kFiles : SplitMode::kBytes;
}

std::vector<Chunk> ChunksOfPart(const DataLayout& layout, const PartitionSpec& spec, uint32_t a,
                                SplitMode split, uint64_t chunk_bytes) {
  split = ResolveSplit(layout, spec, split);
  const uint64_t n = split == SplitMode::kFiles ? layout.files.size() : layout.total_bytes;
  std::pair<uint64_t, uint64_t> range =
      spec.end > 0 ? std::make_pair(spec.begin, spec.end) : PartBounds(n, spec, a);
  const uint64_t lo = range.first, hi = range.second;
  std::vector<Chunk> out;
  if (split == SplitMode::kFiles) {
    for (uint64_t i = lo; i < hi && i < layout.files.size(); ++i) {
      const DataFile& f = layout.files[i];
      if (f.size == 0) continue;
      if (f.gzip) {
        out.push_back({static_cast<uint32_t>(i), 0, f.size, a});
      } else {
        AddPieces(static_cast<uint32_t>(i), 0, f.size, a, chunk_bytes, &out);
      }
    }
    return out;
  }
  uint64_t g = 0;  // Offset of file i in the concatenation.
  for (size_t i = 0; i < layout.files.size() && g < hi; ++i) {
    const DataFile& f = layout.files[i];
    const uint64_t fend = g + f.size;
    if (f.size > 0) {
      if (f.gzip) {
        if (g >= lo && g < hi) out.push_back({static_cast<uint32_t>(i), 0, f.size, a});
      } else if (fend > lo) {
        const uint64_t b = std::max(lo, g) - g, e = std::min(hi, fend) - g;
        if (b < e) AddPieces(static_cast<uint32_t>(i), b, e, a, chunk_bytes, &out);
      }
    }
    g = fend;
  }
  return out;
}

absl::StatusOr<std::vector<Chunk>> PartChunks(const DataLayout& layout, const PartitionSpec& spec,
                                              SplitMode split, uint64_t chunk_bytes) {
  absl::Status s = CheckPartition(spec);
  if (!s.ok()) return s;
  split = ResolveSplit(layout, spec, split);
  const bool files = split == SplitMode::kFiles;
  const uint64_t n = files ? layout.files.size() : layout.total_bytes;
  const char* unit = files ? "files" : "bytes";
  if (spec.end > 0) {
    if (spec.begin >= spec.end || spec.end > n) {
      return absl::InvalidArgumentError(absl::StrCat("partition: range [", spec.begin, ", ",
                                                     spec.end, ") does not fit the ", n, " ", unit,
                                                     " of ", layout.source));
    }
  } else if (spec.count == 0 || spec.index >= spec.count) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: index ", spec.index, " is not below count ", spec.count));
  }
  std::vector<uint32_t> parts = {spec.index};
  parts.insert(parts.end(), spec.also.begin(), spec.also.end());
  std::vector<Chunk> out;
  for (uint32_t a : parts) {
    std::vector<Chunk> c = ChunksOfPart(layout, spec, a, split, chunk_bytes);
    if (c.empty()) {
      size_t gz = 0;
      for (const DataFile& f : layout.files) gz += f.gzip ? 1 : 0;
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: part ", a, " of ", spec.count, " holds none of the ", layout.files.size(),
          " files (", layout.total_bytes, " bytes) of ", layout.source, " (split: ", unit,
          gz > 0 ? absl::StrCat("; ", gz,
                                " gzip files, which cannot be cut: give at least one "
                                "file per worker")
                 : std::string(),
          ")"));
    }
    out.insert(out.end(), c.begin(), c.end());
  }
  return out;
}

std::vector<Chunk> EpochChunkOrder(std::vector<Chunk> chunks, uint64_t seed, uint32_t epoch) {
  uint64_t state = Mix64(seed ^ 0x63686b73ULL) ^ Mix64(uint64_t{epoch} + 1);
  for (size_t i = chunks.size(); i > 1; --i) {
    state = Mix64(state);
    const size_t j = static_cast<size_t>(state % i);
    std::swap(chunks[i - 1], chunks[j]);
  }
  return chunks;
}

}  // namespace pscluster::data
