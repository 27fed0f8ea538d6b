// host:port strings as the daemons advertise them.
#ifndef PSCLUSTER_COMMON_ADDRESS_H_
#define PSCLUSTER_COMMON_ADDRESS_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace pscluster {

// The host of "host:port" or "[v6]:port" (the whole string when it has no port).
absl::string_view HostOf(absl::string_view address);

// localhost, 127.0.0.0/8 (Debian's `hostname -i` gives 127.0.1.1), ::1.
bool IsLoopbackHost(absl::string_view host);

// A warning when a daemon advertises a loopback address to a scheduler that is not on loopback:
// the scheduler, and the other daemons it tells, would call back on their own machine. nullopt
// when the pair is fine.
std::optional<std::string> LoopbackAdvertiseWarning(absl::string_view advertised,
                                                    absl::string_view scheduler);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_ADDRESS_H_
