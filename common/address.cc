#include "common/address.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pscluster {

absl::string_view HostOf(absl::string_view address) {
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    return close == absl::string_view::npos ? address : address.substr(1, close - 1);
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || address.find(':') != colon) return address;
  return address.substr(0, colon);
}

bool IsLoopbackHost(absl::string_view host) {
  return host == "localhost" || host == "ip6-localhost" || host == "::1" ||
         absl::StartsWith(host, "127.");
}

std::optional<std::string> LoopbackAdvertiseWarning(absl::string_view advertised,
                                                    absl::string_view scheduler) {
  const absl::string_view mine = HostOf(advertised);
  // A list of schedulers (one leads): the first stands for them all.
  const absl::string_view theirs = HostOf(scheduler.substr(0, scheduler.find(',')));
  if (!IsLoopbackHost(mine) || IsLoopbackHost(theirs) || theirs.empty()) return std::nullopt;
  return absl::StrCat(
      "advertising ", advertised, ", a loopback address, to the scheduler at ", scheduler,
      ", which is not on loopback: other machines cannot reach this daemon there; set "
      "--advertise_host to an address they can reach (e.g. $(hostname -I | cut -d' ' -f1))");
}

}  // namespace pscluster
