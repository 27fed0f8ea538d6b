#include "scheduler/quotas.h"

#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/atomic_file.h"

namespace pscluster::scheduler {
namespace {

constexpr uint32_t kMaxJobs = 1000000;

struct Unit {
  const char* suffix;
  uint64_t bytes;
};
constexpr Unit kUnits[] = {{"TiB", uint64_t{1} << 40},
                           {"GiB", uint64_t{1} << 30},
                           {"MiB", uint64_t{1} << 20},
                           {"KiB", uint64_t{1} << 10}};

absl::StatusOr<uint64_t> ParseBytes(absl::string_view text) {
  uint64_t unit = 1;
  for (const Unit& u : kUnits) {
    if (absl::EndsWith(text, u.suffix)) {
      unit = u.bytes;
      text.remove_suffix(std::char_traits<char>::length(u.suffix));
      break;
    }
  }
  uint64_t n = 0;
  if (text.empty() || !absl::SimpleAtoi(text, &n) || text[0] == '-' || text[0] == '+') {
    return absl::InvalidArgumentError("not a size (a number of bytes, or with KiB, MiB, GiB, TiB)");
  }
  if (n > std::numeric_limits<uint64_t>::max() / unit) {
    return absl::InvalidArgumentError("too large");
  }
  return n * unit;
}

}  // namespace

absl::StatusOr<Quotas> Quotas::Load(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--quota_file: ", text.status().message()));
  }
  return Parse(*text, path);
}

absl::StatusOr<Quotas> Quotas::Parse(absl::string_view text, const std::string& path) {
  Quotas q;
  q.path_ = path;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty()) continue;
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat("--quota_file ", path, ":", line_no, ": ",
                                                     what));
    };
    if (f.size() != 3) {
      return bad(absl::StrCat("expected 'IDENTITY JOBS SERVER_MEMORY' (use - for no limit), got ",
                              f.size(), " fields"));
    }
    Quota quota;
    quota.line = line_no;
    if (f[1] != "-") {
      uint32_t jobs = 0;
      if (!absl::SimpleAtoi(f[1], &jobs) || f[1][0] == '+' || jobs > kMaxJobs) {
        return bad(absl::StrCat("jobs: '", f[1], "' is not a count from 0 to ", kMaxJobs,
                                " (or -)"));
      }
      quota.jobs = jobs;
    }
    if (f[2] != "-") {
      auto bytes = ParseBytes(f[2]);
      if (!bytes.ok()) {
        return bad(absl::StrCat("server_memory: '", f[2], "': ", bytes.status().message()));
      }
      quota.server_memory = *bytes;
      q.limits_memory_ = true;
    }
    auto [it, added] = q.by_identity_.emplace(std::string(f[0]), quota);
    if (!added) {
      return bad(absl::StrCat("identity '", f[0], "' already has a quota on line ",
                              it->second.line));
    }
  }
  return q;
}

const Quota* Quotas::For(absl::string_view identity) const {
  auto it = by_identity_.find(identity);
  if (it == by_identity_.end()) it = by_identity_.find("*");
  return it == by_identity_.end() ? nullptr : &it->second;
}

std::string BytesText(uint64_t bytes) {
  for (const Unit& u : kUnits) {
    if (bytes >= u.bytes && bytes % u.bytes == 0) {
      return absl::StrCat(bytes / u.bytes, " ", u.suffix);
    }
  }
  return absl::StrCat(bytes, " bytes");
}

}  // namespace pscluster::scheduler
