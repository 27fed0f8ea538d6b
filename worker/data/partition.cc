#include "worker/data/partition.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sharding.h"

namespace pscluster::data {
namespace {

// Fisher-Yates with a fixed generator (std::shuffle's algorithm is not specified across
// standard libraries, and every worker must agree on the permutation).
void Shuffle(std::vector<int64_t>* v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = v->size(); i > 1; --i) {
    size_t j = static_cast<size_t>(rng() % i);
    std::swap((*v)[i - 1], (*v)[j]);
  }
}

// Share of part `a` (1 each when the parts are equal).
uint64_t ShareOf(const PartitionSpec& spec, uint32_t a) {
  return spec.shares.empty() ? 1 : spec.shares[a];
}

}  // namespace

std::pair<uint64_t, uint64_t> PartBounds(uint64_t n, const PartitionSpec& spec, uint32_t a) {
  if (spec.shares.empty()) {
    // 128-bit products: n may count bytes of a large set.
    const unsigned __int128 wide = n;
    return {static_cast<uint64_t>(wide * a / spec.count),
            static_cast<uint64_t>(wide * (a + 1) / spec.count)};
  }
  unsigned __int128 before = 0, total = 0;
  for (uint32_t i = 0; i < spec.count; ++i) {
    if (i < a) before += spec.shares[i];
    total += spec.shares[i];
  }
  return {static_cast<uint64_t>(n * before / total),
          static_cast<uint64_t>(n * (before + spec.shares[a]) / total)};
}

absl::Status CheckPartition(const PartitionSpec& spec) {
  if (!spec.shares.empty()) {
    if (spec.end > 0) {
      return absl::InvalidArgumentError("partition.shares: shares size parts of index/count, not "
                                        "a range");
    }
    if (spec.shares.size() != spec.count) {
      return absl::InvalidArgumentError(absl::StrCat("partition.shares: ", spec.shares.size(),
                                                     " shares for ", spec.count, " parts"));
    }
    for (size_t i = 0; i < spec.shares.size(); ++i) {
      if (spec.shares[i] == 0 || spec.shares[i] > kMaxShare) {
        return absl::InvalidArgumentError(absl::StrCat("partition.shares[", i, "]: ",
                                                       spec.shares[i], " is not in [1, ",
                                                       kMaxShare, "]"));
      }
    }
  }
  for (size_t i = 0; i < spec.also.size(); ++i) {
    const uint32_t a = spec.also[i];
    if (spec.end > 0) {
      return absl::InvalidArgumentError("partition.also: extra parts need index/count, not a "
                                        "range");
    }
    if (a >= spec.count || a == spec.index ||
        std::find(spec.also.begin(), spec.also.begin() + i, a) != spec.also.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition.also[", i, "]: part ", a, " is not another part below count ", spec.count,
          " (index ", spec.index, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> PartitionExamples(int64_t n, uint64_t seed,
                                                       const PartitionSpec& spec) {
  if (n <= 0) return absl::InvalidArgumentError("the training set is empty");
  uint64_t begin = 0, end = 0;
  if (spec.end > 0) {
    if (spec.begin >= spec.end || spec.end > static_cast<uint64_t>(n)) {
      return absl::InvalidArgumentError(absl::StrCat("partition: range [", spec.begin, ", ",
                                                     spec.end, ") does not fit ", n, " examples"));
    }
    begin = spec.begin;
    end = spec.end;
  } else {
    if (spec.count == 0 || spec.index >= spec.count) {
      return absl::InvalidArgumentError(absl::StrCat("partition: index ", spec.index,
                                                     " is not below count ", spec.count));
    }
    if (spec.count > static_cast<uint64_t>(n)) {
      return absl::InvalidArgumentError(absl::StrCat("partition: ", spec.count,
                                                     " parts for only ", n, " examples"));
    }
  }
  absl::Status extra = CheckPartition(spec);
  if (!extra.ok()) return extra;
  if (spec.end == 0) {
    std::tie(begin, end) = PartBounds(n, spec, spec.index);
    std::vector<uint32_t> parts = spec.also;
    parts.push_back(spec.index);
    for (uint32_t a : parts) {
      auto [b, e] = PartBounds(n, spec, a);
      if (b >= e) {
        return absl::InvalidArgumentError(absl::StrCat(
            "partition: part ", a, " of ", spec.count, " holds none of the ", n,
            " examples (its share is too small)"));
      }
    }
  }
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  Shuffle(&perm, Mix64(seed ^ 0x9a27));
  std::vector<int64_t> out(perm.begin() + begin, perm.begin() + end);
  for (uint32_t a : spec.also) {
    auto [b, e] = PartBounds(n, spec, a);
    out.insert(out.end(), perm.begin() + b, perm.begin() + e);
  }
  return out;
}

uint32_t RankBatch(const PartitionSpec& spec, uint32_t batch) {
  if (spec.end > 0 || (spec.shares.empty() && spec.also.empty()) || spec.count == 0) {
    return batch;
  }
  uint64_t total = 0, read = ShareOf(spec, spec.index);
  for (uint32_t i = 0; i < spec.count; ++i) total += ShareOf(spec, i);
  for (uint32_t a : spec.also) read += ShareOf(spec, a);
  // batch * count * read / total, rounded to the nearest.
  const unsigned __int128 num = static_cast<unsigned __int128>(batch) * spec.count * read;
  const uint64_t b = static_cast<uint64_t>((num + total / 2) / total);
  return static_cast<uint32_t>(std::clamp<uint64_t>(b, 1, UINT32_MAX));
}

std::vector<int64_t> EpochOrder(const std::vector<int64_t>& part, uint64_t seed, uint32_t epoch,
                                uint32_t part_index) {
  std::vector<int64_t> order = part;
  Shuffle(&order, Mix64(seed ^ Mix64(epoch + 1) ^ Mix64(uint64_t{part_index} << 32)));
  return order;
}

}  // namespace pscluster::data
