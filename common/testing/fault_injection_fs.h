// FaultInjectionFileSystem: an in-memory FileSystem (common/file_system.h) that models what a
// crash keeps, after leveldb's FaultInjectionTestEnv. A file's data is durable once the file is
// synced; a directory entry (creation, rename, removal) once its directory is synced. Crash()
// drops everything not durable. Tests stop a sequence of operations after any one of them
// (CrashAfter) or make one kind of operation fail (FailNext), then check what a restarted
// process would find.
#ifndef PSCLUSTER_COMMON_TESTING_FAULT_INJECTION_FS_H_
#define PSCLUSTER_COMMON_TESTING_FAULT_INJECTION_FS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/file_system.h"

namespace pscluster::testing {

class FaultInjectionFileSystem final : public FileSystem {
 public:
  enum class Op { kCreate, kAppend, kSync, kClose, kRename, kSyncDir, kRemove, kMakeDirs };

  // After `ops` more operations that change something (every Op above), each further one fails
  // with UNAVAILABLE ("crashed") and changes nothing, as if the process had died there. -1: off.
  void CrashAfter(int ops);
  // The next operation of kind `op` fails with `status` and changes nothing.
  void FailNext(Op op, absl::Status status);
  // The machine restarts: what was not durable is lost; operations work again.
  void Crash();
  // Operations that changed something so far.
  int ops() const;
  // Every path that exists now (files only), sorted.
  std::vector<std::string> Files() const;

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status Remove(const std::string& path) override;
  absl::StatusOr<std::string> ReadFile(const std::string& path) override;
  absl::Status MakeDirs(const std::string& dir) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;

 private:
  class File;
  struct Inode {
    std::string data;     // What readers see.
    std::string durable;  // What survives a crash.
  };
  // Counts the operation; its failure if one is injected or the process "crashed".
  absl::Status Enter(Op op, const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Inode>> entries_ ABSL_GUARDED_BY(mu_);  // Live names.
  std::map<std::string, std::shared_ptr<Inode>> durable_entries_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, bool> dirs_ ABSL_GUARDED_BY(mu_);  // Directories (made durable at once).
  std::map<Op, absl::Status> fail_next_ ABSL_GUARDED_BY(mu_);
  int ops_ ABSL_GUARDED_BY(mu_) = 0;
  int crash_after_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace pscluster::testing

#endif  // PSCLUSTER_COMMON_TESTING_FAULT_INJECTION_FS_H_
