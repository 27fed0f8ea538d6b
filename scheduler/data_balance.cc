#include "scheduler/data_balance.h"

#include <algorithm>
#include <cmath>

namespace pscluster::scheduler {

std::optional<std::vector<uint32_t>> PickDataShares(const std::vector<double>& rates,
                                                    const std::vector<uint32_t>& current,
                                                    const DataBalanceOptions& options) {
  const size_t n = rates.size();
  if (n < 2 || (!current.empty() && current.size() != n)) return std::nullopt;
  double total_rate = 0;
  for (double r : rates) {
    if (!std::isfinite(r) || r <= 0) return std::nullopt;
    total_rate += r;
  }
  const double skew = std::max(1.0, options.max_skew);
  std::vector<uint32_t> next(n);
  double next_total = 0, current_total = 0;
  for (size_t i = 0; i < n; ++i) {
    double share = kEqualShare * static_cast<double>(n) * rates[i] / total_rate;
    share = std::clamp(share, kEqualShare / skew, kEqualShare * skew);
    next[i] = std::max<uint32_t>(1, static_cast<uint32_t>(std::lround(share)));
    next_total += next[i];
    current_total += current.empty() ? kEqualShare : std::max<uint32_t>(1, current[i]);
  }
  bool change = false;
  for (size_t i = 0; i < n; ++i) {
    const double now =
        (current.empty() ? kEqualShare : std::max<uint32_t>(1, current[i])) / current_total;
    const double want = next[i] / next_total;
    if (std::abs(want / now - 1.0) > options.tolerance) change = true;
  }
  if (!change) return std::nullopt;
  return next;
}

}  // namespace pscluster::scheduler
