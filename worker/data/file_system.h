// The file system the readers use, injected so that tests can fake read faults (STYLE #6).
// Errors name the path.
#ifndef PSCLUSTER_WORKER_DATA_FILE_SYSTEM_H_
#define PSCLUSTER_WORKER_DATA_FILE_SYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pscluster::data {

// A file opened for reading at any offset. Thread-compatible: one reader at a time.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads up to n bytes at `offset` into buf: the bytes read, fewer only at the end of the file
  // (0 at or past it).
  virtual absl::StatusOr<size_t> Read(uint64_t offset, size_t n, char* buf) = 0;
};

struct FileStat {
  bool is_dir = false;
  uint64_t size = 0;
};

// Thread-safe.
class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // NOT_FOUND ("path: no such file or directory") when nothing is there.
  virtual absl::StatusOr<FileStat> Stat(const std::string& path) = 0;
  // The names (not paths) in a directory, unsorted, without "." and "..".
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // The paths matching a shell pattern, sorted; empty when none match.
  virtual absl::StatusOr<std::vector<std::string>> Glob(const std::string& pattern) = 0;
  virtual absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(const std::string& path) = 0;
};

// The local (or mounted shared) file system, through POSIX calls.
std::unique_ptr<FileSystem> NewPosixFileSystem();

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_FILE_SYSTEM_H_
