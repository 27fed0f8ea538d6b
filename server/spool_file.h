// A snapshot spooled to local disk instead of memory: the copy of a job that another copy loads
// (a live copy's seed, a shard that changes hands on the same server) when the job's tables
// have a disk tier and may not fit in memory twice.
//
// The file is anonymous: created in the directory and unlinked at once, so it is never seen
// there, and the kernel frees it when the last holder closes it, also after a kill -9. Written
// once (Append), then read in pieces (pread), from any thread, by whoever holds it.
#ifndef PSCLUSTER_SERVER_SPOOL_FILE_H_
#define PSCLUSTER_SERVER_SPOOL_FILE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/checkpoint_file.h"

namespace pscluster {

class SpoolFile {
 public:
  // A new empty file in `dir`; `what` names it in errors ("seed of job 'j'"). Errors name the
  // directory.
  static absl::StatusOr<std::shared_ptr<SpoolFile>> Create(const std::string& dir,
                                                           const std::string& what);
  ~SpoolFile();
  SpoolFile(const SpoolFile&) = delete;
  SpoolFile& operator=(const SpoolFile&) = delete;

  // Appends at the end (one writer at a time). A full disk is RESOURCE_EXHAUSTED naming the
  // directory; nothing is half-appended that a later Read could see (size() moves only on
  // success).
  absl::Status Append(absl::string_view data);
  uint64_t size() const { return size_.load(std::memory_order_acquire); }
  // The `n` bytes at `offset`, read into `scratch` (DATA_LOSS past the end).
  absl::StatusOr<absl::string_view> Read(uint64_t offset, size_t n, std::string* scratch) const;
  const std::string& dir() const { return dir_; }

 private:
  SpoolFile(int fd, std::string dir, std::string what)
      : fd_(fd), dir_(std::move(dir)), what_(std::move(what)) {}
  const int fd_;
  const std::string dir_;
  const std::string what_;
  std::atomic<uint64_t> size_{0};
};

// A checkpoint held in a spool file, read a piece at a time. Keeps the file alive.
class SpoolCheckpointSource : public CheckpointSource {
 public:
  explicit SpoolCheckpointSource(std::shared_ptr<const SpoolFile> file) : file_(std::move(file)) {}
  uint64_t size() const override { return file_->size(); }
  absl::StatusOr<absl::string_view> Read(uint64_t offset, size_t n,
                                         std::string* scratch) override {
    return file_->Read(offset, n, scratch);
  }

 private:
  std::shared_ptr<const SpoolFile> file_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_SPOOL_FILE_H_
