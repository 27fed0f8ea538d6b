// Confining the files a daemon reads and writes on a caller's behalf (checkpoints, restores,
// exports) to a configured root directory, so that a caller cannot make the daemon write or read
// anywhere else it can (`/etc/...`, `../..`, a symlink that points out of the root).
#ifndef PSCLUSTER_COMMON_PATH_ROOT_H_
#define PSCLUSTER_COMMON_PATH_ROOT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pscluster {

// A root given by a flag: an absolute path to an existing directory, returned resolved
// (symlinks followed). An error names `flag`.
absl::StatusOr<std::string> ResolveRoot(const std::string& root, absl::string_view flag);

// OK when `root` is empty (unconfined) or `path` lies inside `root` (a ResolveRoot result) once
// ".." and "." are collapsed and the symlinks of its existing part are followed. Otherwise
// PERMISSION_DENIED naming `field`, the path and the root; a relative path with a root set is
// INVALID_ARGUMENT.
absl::Status CheckUnderRoot(const std::string& path, const std::string& root,
                            absl::string_view field);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_PATH_ROOT_H_
