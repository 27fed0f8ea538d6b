// Crash-safe file replacement: write a temp file beside the target, fsync it, rename it over the
// target, fsync the directory. After a crash at any point the target holds either the old or the
// new contents, never a mix, and once the call returned OK the new contents survive a crash
// (file_system_test crashes it after every step on a file system that models what fsync makes
// durable). A failed call removes its temp file and leaves the target as it was.
#ifndef PSCLUSTER_COMMON_ATOMIC_FILE_H_
#define PSCLUSTER_COMMON_ATOMIC_FILE_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_system.h"

namespace pscluster {

// The same, written in pieces: Append as often as needed, then Commit (fsync, rename over the
// target, fsync the directory). A writer destroyed without a successful Commit removes its temp
// file and leaves the target as it was.
class AtomicFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Create(FileSystem* fs,
                                                                  const std::string& path);
  ~AtomicFileWriter();
  absl::Status Append(absl::string_view data);
  absl::Status Commit();

 private:
  AtomicFileWriter(FileSystem* fs, std::string path, std::string tmp,
                   std::unique_ptr<WritableFile> file)
      : fs_(fs), path_(std::move(path)), tmp_(std::move(tmp)), file_(std::move(file)) {}

  FileSystem* const fs_;
  const std::string path_;
  const std::string tmp_;
  std::unique_ptr<WritableFile> file_;  // Null once closed.
  bool committed_ = false;
};

// Writes `data` to `path` crash-safe. Errors name the path and the failing step.
absl::Status WriteFileAtomically(FileSystem* fs, const std::string& path,
                                 absl::string_view data);
// The same on FileSystem::Default().
absl::Status WriteFileAtomically(const std::string& path, absl::string_view data);

// Reads a whole file (FileSystem::Default()). NOT_FOUND names the path when it does not exist.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Creates `dir` and its parents (like mkdir -p).
absl::Status MakeDirs(const std::string& dir);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_ATOMIC_FILE_H_
