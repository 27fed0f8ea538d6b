// The file operations behind checkpoints, exports and crash-safe writes, as an interface (the
// habit of leveldb's Env): the daemons use the POSIX one, tests inject one that fails or
// "crashes" between a write, its fsync and the rename (common/testing/fault_injection_fs.h).
//
// Errors name the path and the step that failed, with codes as for any user-given path:
// NOT_FOUND (missing), PERMISSION_DENIED, RESOURCE_EXHAUSTED (disk full), INVALID_ARGUMENT (a
// path that cannot name a file), INTERNAL otherwise.
#ifndef PSCLUSTER_COMMON_FILE_SYSTEM_H_
#define PSCLUSTER_COMMON_FILE_SYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pscluster {

// A file being written. Its data is durable only after Sync(); Close() does not sync.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(absl::string_view data) = 0;
  virtual absl::Status Sync() = 0;
  virtual absl::Status Close() = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // The POSIX file system (never null, lives for the process).
  static FileSystem* Default();

  // Creates `path` (truncating what was there).
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // Renames `from` over `to` (atomic for readers; durable after SyncDir of `to`'s directory).
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // Makes the entries of directory `dir` (creations, renames, removals) durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  virtual absl::Status Remove(const std::string& path) = 0;
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // Up to `n` bytes of `path` from `offset` (fewer at its end). The default reads the whole file.
  virtual absl::StatusOr<std::string> ReadFileRange(const std::string& path, uint64_t offset,
                                                    size_t n) {
    auto all = ReadFile(path);
    if (!all.ok()) return all.status();
    if (offset >= all->size()) return std::string();
    return all->substr(offset, n);
  }
  // The size of the file at `path` in bytes. The default reads the whole file.
  virtual absl::StatusOr<uint64_t> FileSize(const std::string& path) {
    auto all = ReadFile(path);
    if (!all.ok()) return all.status();
    return all->size();
  }
  // Creates `dir` and its parents (mkdir -p); FAILED_PRECONDITION if it names a file.
  virtual absl::Status MakeDirs(const std::string& dir) = 0;
  // The names of the entries of `dir` (not "." or ".."), in no particular order.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
};

// The directory part of `path` ("." when it has none).
std::string DirName(const std::string& path);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_FILE_SYSTEM_H_
