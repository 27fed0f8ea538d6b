#include "common/logging.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace pscluster {

std::shared_ptr<spdlog::logger> Logger(std::string_view component) {
  std::string name(component);
  if (auto existing = spdlog::get(name)) return existing;
  try {
    auto logger = spdlog::stderr_color_mt(name);
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ [%n] %v");
    return logger;
  } catch (const spdlog::spdlog_ex&) {
    // Another thread registered it between get() and create.
    return spdlog::get(name);
  }
}

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

absl::Status SetLogLevel(absl::string_view level) {
  static constexpr absl::string_view kLevels[] = {"trace", "debug", "info", "warn",
                                                 "error", "critical", "off"};
  for (absl::string_view l : kLevels) {
    if (level == l) {
      spdlog::set_level(spdlog::level::from_str(std::string(level)));
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--log_level: unknown level '", level,
      "' (expected trace, debug, info, warn, error, critical or off)"));
}

}  // namespace pscluster
