#include "common/atomic_file.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"

namespace pscluster {

absl::Status WriteFileAtomically(FileSystem* fs, const std::string& path,
                                 absl::string_view data) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  auto file = fs->NewWritableFile(tmp);
  if (!file.ok()) return file.status();
  absl::Status s = (*file)->Append(data);
  if (s.ok()) s = (*file)->Sync();
  absl::Status closed = (*file)->Close();
  if (s.ok()) s = closed;
  if (s.ok()) s = fs->Rename(tmp, path);
  if (!s.ok()) {
    (void)fs->Remove(tmp);
    return s;
  }
  return fs->SyncDir(DirName(path));
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view data) {
  return WriteFileAtomically(FileSystem::Default(), path, data);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  return FileSystem::Default()->ReadFile(path);
}

absl::Status MakeDirs(const std::string& dir) { return FileSystem::Default()->MakeDirs(dir); }

}  // namespace pscluster
