// Quotas per identity (ps_scheduler --quota_file): how many unfinished jobs an identity may
// have and how much server memory its running jobs may hold before it may submit another.
//
// The file holds one identity per line:
//
//   # identity   jobs   server_memory
//   alice        2      8GiB
//   *            4      -
//
// `identity` is a name of the token file (common/token_file.h); `*` applies to every identity
// without a line of its own (without a `*` line they have no quota). `jobs`: at most this many
// jobs not in a final state (queued, placing, running or recovering) at once. `server_memory`:
// bytes (a number, or with the suffix KiB, MiB, GiB or TiB) that the servers report for the
// identity's running jobs (parameters and optimizer state, backups included); a submission is
// refused once they reach it. `-` = no limit. Errors name the file and line.
//
// Thread-safe: a Quotas is immutable once parsed.
#ifndef PSCLUSTER_SCHEDULER_QUOTAS_H_
#define PSCLUSTER_SCHEDULER_QUOTAS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pscluster::scheduler {

struct Quota {
  std::optional<uint32_t> jobs;           // nullopt: no limit.
  std::optional<uint64_t> server_memory;  // Bytes; nullopt: no limit.
  int line = 0;                           // Its line in the file.
};

class Quotas {
 public:
  // INVALID_ARGUMENT naming `path` and the line for a malformed file; NOT_FOUND when missing.
  static absl::StatusOr<Quotas> Load(const std::string& path);
  // The same for the file's text (`path` names it in errors).
  static absl::StatusOr<Quotas> Parse(absl::string_view text, const std::string& path);

  // The quota of `identity`: its own line, else `*`'s, else nullptr (no quota).
  const Quota* For(absl::string_view identity) const;
  // Whether any line limits server memory (the scheduler then polls every running job's
  // servers for their memory).
  bool limits_memory() const { return limits_memory_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::map<std::string, Quota, std::less<>> by_identity_;
  bool limits_memory_ = false;
};

// "8 GiB", "512 MiB", "3 KiB", "100 bytes": the largest unit that divides `bytes`.
std::string BytesText(uint64_t bytes);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_QUOTAS_H_
