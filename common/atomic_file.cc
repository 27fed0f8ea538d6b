#include "common/atomic_file.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"

namespace pscluster {

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(
    FileSystem* fs, const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  auto file = fs->NewWritableFile(tmp);
  if (!file.ok()) return file.status();
  return std::unique_ptr<AtomicFileWriter>(
      new AtomicFileWriter(fs, path, std::move(tmp), std::move(*file)));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (committed_) return;
  if (file_ != nullptr) (void)file_->Close();
  (void)fs_->Remove(tmp_);
}

absl::Status AtomicFileWriter::Append(absl::string_view data) {
  if (file_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(path_, ": closed"));
  return file_->Append(data);
}

absl::Status AtomicFileWriter::Commit() {
  if (file_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(path_, ": closed"));
  absl::Status s = file_->Sync();
  absl::Status closed = file_->Close();
  file_.reset();
  if (s.ok()) s = closed;
  if (s.ok()) s = fs_->Rename(tmp_, path_);
  if (!s.ok()) return s;  // The destructor removes the temp file.
  committed_ = true;
  return fs_->SyncDir(DirName(path_));
}

absl::Status WriteFileAtomically(FileSystem* fs, const std::string& path, absl::string_view data) {
  auto writer = AtomicFileWriter::Create(fs, path);
  if (!writer.ok()) return writer.status();
  absl::Status s = (*writer)->Append(data);
  if (!s.ok()) return s;
  return (*writer)->Commit();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view data) {
  return WriteFileAtomically(FileSystem::Default(), path, data);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  return FileSystem::Default()->ReadFile(path);
}

absl::Status MakeDirs(const std::string& dir) { return FileSystem::Default()->MakeDirs(dir); }

}  // namespace pscluster
