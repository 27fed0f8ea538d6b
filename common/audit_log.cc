#include "common/audit_log.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/authz.h"
#include "common/logging.h"
#include "common/token_file.h"

namespace pscluster {
namespace {

// A JSON string literal of `s`.
std::string Quote(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace

bool AuditedMethod(absl::string_view method) {
  const RoleSet* allowed = AllowedRoles(method);
  if (allowed == nullptr) return false;
  const RoleSet changers =
      static_cast<RoleSet>(Role::kAdmin) | static_cast<RoleSet>(Role::kScheduler);
  return (*allowed & ~changers) == 0;
}

absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--audit_log ", path, ": cannot open for appending: ", std::strerror(errno)));
  }
  return std::unique_ptr<AuditLog>(new AuditLog(path, fd));
}

AuditLog::~AuditLog() { ::close(fd_); }

std::string AuditLog::Line(const AuditRecord& r) {
  std::string line = absl::StrCat(
      "{\"time\":", Quote(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", r.time, absl::UTCTimeZone())),
      ",\"method\":", Quote(r.method), ",\"identity\":", Quote(r.identity),
      ",\"peer\":", Quote(r.peer));
  if (!r.job_id.empty()) absl::StrAppend(&line, ",\"job_id\":", Quote(r.job_id));
  absl::StrAppend(&line, ",\"code\":", Quote(absl::StatusCodeToString(r.status.code())));
  if (!r.status.ok()) absl::StrAppend(&line, ",\"message\":", Quote(r.status.message()));
  return line + "}";
}

void AuditLog::Record(const AuditRecord& record) {
  const std::string line = Line(record) + "\n";
  absl::MutexLock l(&mu_);
  const ssize_t n = ::write(fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size())) {
    if (!failing_) {
      Logger("audit")->error("audit log {}: write failed: {}", path_,
                             n < 0 ? std::strerror(errno) : "short write");
    }
    failing_ = true;
    return;
  }
  failing_ = false;
}

void AuditCounts::Count(absl::string_view method, absl::StatusCode code) {
  const size_t dot = method.rfind('.');
  absl::string_view name = dot == absl::string_view::npos ? method : method.substr(dot + 1);
  absl::MutexLock l(&mu_);
  ++counts_[{std::string(name), code}];
}

std::vector<Sample> AuditCounts::Samples() const {
  std::vector<Sample> out;
  absl::MutexLock l(&mu_);
  out.reserve(counts_.size());
  for (const auto& [key, n] : counts_) {
    out.push_back(Sample{absl::StrCat("method=\"", key.first, "\",code=\"",
                                      absl::StatusCodeToString(key.second), "\""),
                         static_cast<double>(n)});
  }
  return out;
}

}  // namespace pscluster
