#include "scheduler/pass_helpers.h"

#include "absl/strings/str_cat.h"
#include "scheduler/parallel.h"

namespace pscluster::scheduler {

std::shared_ptr<spdlog::logger> Log() { return Logger("scheduler"); }

std::vector<int64_t> ClockOnEveryServer(
    const v1::ShardMap& map,
    const std::function<absl::StatusOr<int64_t>(const v1::ServerEndpoint&)>& call,
    std::string* why) {
  std::vector<int64_t> clocks(map.servers_size(), -1);
  std::vector<std::string> errors(map.servers_size());
  ParallelFor(map.servers_size(), [&](size_t i) {
    const v1::ServerEndpoint& ep = map.servers(i);
    auto clock = call(ep);
    if (clock.ok() && *clock >= 0) {
      clocks[i] = *clock;
    } else {
      errors[i] = clock.ok()
                      ? absl::StrCat("server ", ep.node_id(), " reports no clock for it")
                      : absl::StrCat("server ", ep.node_id(), ": ", clock.status().message());
    }
  });
  why->clear();
  for (const std::string& e : errors) {
    if (why->empty()) *why = e;
  }
  return clocks;
}

}  // namespace pscluster::scheduler
