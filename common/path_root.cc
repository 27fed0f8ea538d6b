#include "common/path_root.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pscluster {
namespace {

// "/a/./b/../c/" -> "/a/c" (absolute paths only).
std::string Normalize(const std::string& path) {
  std::vector<std::string> parts;
  for (absl::string_view p : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (p == ".") continue;
    if (p == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.emplace_back(p);
  }
  return "/" + absl::StrJoin(parts, "/");
}

// The real path of `path` (normalized, absolute): its longest existing prefix resolved with
// realpath(), the rest appended as it is.
std::string Resolve(const std::string& path) {
  std::string existing = path;
  std::string rest;
  while (true) {
    char buf[PATH_MAX];
    if (realpath(existing.c_str(), buf) != nullptr) {
      std::string r = buf;
      if (rest.empty()) return r;
      return r == "/" ? "/" + rest : r + "/" + rest;
    }
    const size_t slash = existing.rfind('/');
    if (slash == std::string::npos || existing == "/") return path;
    const std::string last = existing.substr(slash + 1);
    rest = rest.empty() ? last : last + "/" + rest;
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
}

}  // namespace

absl::StatusOr<std::string> ResolveRoot(const std::string& root, absl::string_view flag) {
  if (root.empty() || root[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", root, "' must be an absolute directory path"));
  }
  char buf[PATH_MAX];
  if (realpath(root.c_str(), buf) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": directory ", root, " does not exist or cannot be reached"));
  }
  struct stat st;
  if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", root, " is not a directory"));
  }
  return std::string(buf);
}

absl::Status CheckUnderRoot(const std::string& path, const std::string& root,
                            absl::string_view field) {
  if (root.empty()) return absl::OkStatus();
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", path, "' must be an absolute path under ", root));
  }
  const std::string real = Resolve(Normalize(path));
  const bool inside = root == "/" || real == root ||
                      (real.size() > root.size() && real.compare(0, root.size(), root) == 0 &&
                       real[root.size()] == '/');
  if (!inside) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, ": ", path, " is outside ", root, " (the root this daemon may use for it)"));
  }
  return absl::OkStatus();
}

}  // namespace pscluster
