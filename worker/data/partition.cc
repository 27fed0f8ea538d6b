#include "worker/data/partition.h"

#include <algorithm>
#include <numeric>
#include <random>

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

}  // namespace

absl::Status CheckExtraParts(const PartitionSpec& spec) {
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
  uint64_t begin, end;
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
    begin = static_cast<uint64_t>(n) * spec.index / spec.count;
    end = static_cast<uint64_t>(n) * (spec.index + 1) / spec.count;
  }
  absl::Status extra = CheckExtraParts(spec);
  if (!extra.ok()) return extra;
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  Shuffle(&perm, Mix64(seed ^ 0x9a27));
  std::vector<int64_t> out(perm.begin() + begin, perm.begin() + end);
  for (uint32_t a : spec.also) {
    out.insert(out.end(), perm.begin() + static_cast<uint64_t>(n) * a / spec.count,
               perm.begin() + static_cast<uint64_t>(n) * (a + 1) / spec.count);
  }
  return out;
}

std::vector<int64_t> EpochOrder(const std::vector<int64_t>& part, uint64_t seed, uint32_t epoch,
                                uint32_t part_index) {
  std::vector<int64_t> order = part;
  Shuffle(&order, Mix64(seed ^ Mix64(epoch + 1) ^ Mix64(uint64_t{part_index} << 32)));
  return order;
}

}  // namespace pscluster::data
