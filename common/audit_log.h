// An audit log: one JSON line per call that changes a daemon's state, and per refused call, in
// an append-only file (--audit_log), so that an operator can answer "who did what, when, and
// was it allowed":
//
//   {"time":"2026-12-02T01:20:03.512Z","method":"pscluster.v1.Scheduler.CancelJob",
//    "identity":"alice","peer":"ipv4:10.0.0.7:51234","job_id":"job-3","code":"OK"}
//
// Which calls: every call refused by authentication or authorization, and every call of a
// method that changes state (AuditedMethod: those only admin or scheduler may call); reads,
// heartbeats and the data plane are not logged. Each line is written with one write(2) to a file
// opened with O_APPEND. Thread-safe.
#ifndef PSCLUSTER_COMMON_AUDIT_LOG_H_
#define PSCLUSTER_COMMON_AUDIT_LOG_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"

namespace pscluster {

struct AuditRecord {
  absl::Time time;
  std::string method;    // Full name, "pscluster.v1.Scheduler.SubmitJob".
  std::string identity;  // From the token file ("" = not identified, or no token file).
  std::string peer;      // gRPC's peer string.
  std::string job_id;    // The request's job_id field, when it has one.
  absl::Status status;   // The answer.
  bool checked = false;  // Passed authentication and authorization (a later PERMISSION_DENIED
                         // is the handler's, not a refusal of the caller).
};

// Whether calls of `method` (full name) are logged whatever their outcome: the methods that
// change state (only admin or scheduler may call them).
bool AuditedMethod(absl::string_view method);

class AuditLog {
 public:
  // Opens (creating, mode 0600) `path` for appending; an error names the file.
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(const std::string& path);
  ~AuditLog();

  // Appends the record's line. A failed write is logged (once per failure streak), not fatal.
  void Record(const AuditRecord& record);

  // The JSON line of `record` (no newline).
  static std::string Line(const AuditRecord& record);

  const std::string& path() const { return path_; }

 private:
  AuditLog(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  const std::string path_;
  const int fd_;
  absl::Mutex mu_;
  bool failing_ ABSL_GUARDED_BY(mu_) = false;
};

// Counts of the calls the audit log records (AuditLog's rule: every refused call and every call
// of an AuditedMethod), by method and answer, for the metric
// pscluster_audit_calls_total{method="CancelJob",code="PERMISSION_DENIED"}. Kept whether or not
// a log file is written. Thread-safe.
class AuditCounts {
 public:
  // `method`: the full name ("pscluster.v1.Scheduler.CancelJob"); counted under its last part.
  void Count(absl::string_view method, absl::StatusCode code);
  // One sample per (method, code) seen, sorted; labels method="...",code="...".
  std::vector<Sample> Samples() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, absl::StatusCode>, uint64_t> counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_AUDIT_LOG_H_
