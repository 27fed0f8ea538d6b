// The files of a data set: a file, a directory (its regular files, not those named '.*' or
// '_*' such as _SUCCESS markers; not recursive) or a glob (its matching regular files), sorted
// by path, with their sizes and whether each is gzip (by its magic bytes, not its name).
#ifndef PSCLUSTER_WORKER_DATA_DATA_FILES_H_
#define PSCLUSTER_WORKER_DATA_DATA_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/file_system.h"

namespace pscluster::data {

struct DataFile {
  std::string path;
  uint64_t size = 0;  // Bytes on disk (compressed, for gzip).
  bool gzip = false;
};

struct DataLayout {
  std::string source;  // The path or pattern as given.
  std::vector<DataFile> files;
  uint64_t total_bytes = 0;

  // A hash of the paths, sizes and kinds: ranks that cut the set into parts must see the same
  // files, which they can check by comparing fingerprints.
  uint64_t Fingerprint() const;
};

// Lists `source`. `key` names the option in errors: INVALID_ARGUMENT for an empty source,
// NOT_FOUND "train: /data/x: no such file or directory" / "... matches no file" / "... holds no
// data files".
absl::StatusOr<DataLayout> ListDataFiles(FileSystem* fs, absl::string_view key,
                                         const std::string& source);

// Whether the path holds a glob pattern (*, ? or [).
bool IsGlob(absl::string_view path);

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_DATA_FILES_H_
