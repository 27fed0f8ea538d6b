// One spdlog logger per component ("server", "scheduler", "worker", "psctl", ...), all writing to
// stderr with the component's name in each line.
//
// A daemon may crash (CHECK/abort) only on a broken invariant of its own; anything that came from
// the network or the disk is an error to handle and log, never a reason to abort.
#ifndef PSCLUSTER_COMMON_LOGGING_H_
#define PSCLUSTER_COMMON_LOGGING_H_

#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

// Debian's Abseil has its own absl::string_view (not std::string_view); let fmt/spdlog print it
// and absl::Status directly.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename Ctx>
  auto format(absl::string_view s, Ctx& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};

template <>
struct fmt::formatter<absl::Status> : fmt::formatter<fmt::string_view> {
  template <typename Ctx>
  auto format(const absl::Status& s, Ctx& ctx) const {
    std::string text = s.ToString();
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(text), ctx);
  }
};

namespace pscluster {

// Returns the logger of `component`, creating it on first use. Thread-safe.
std::shared_ptr<spdlog::logger> Logger(std::string_view component);

// Sets the level of every logger, current and future, from a --log_level value: one of trace,
// debug, info, warn, error, critical, off. INVALID_ARGUMENT names the flag for anything else.
absl::Status SetLogLevel(absl::string_view level);

// For daemons and benchmarks: turns off Abseil's mutex deadlock detection, which the system
// Abseil build keeps on and which bookkeeps every lock acquisition (tests keep it on).
void DisableMutexDeadlockDetection();

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_LOGGING_H_
