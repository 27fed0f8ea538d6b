#include "common/testing/fault_injection_fs.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pscluster::testing {

class FaultInjectionFileSystem::File final : public WritableFile {
 public:
  File(FaultInjectionFileSystem* fs, std::string path, std::shared_ptr<Inode> inode)
      : fs_(fs), path_(std::move(path)), inode_(std::move(inode)) {}
  absl::Status Append(absl::string_view data) override {
    absl::MutexLock l(&fs_->mu_);
    absl::Status s = fs_->Enter(Op::kAppend, path_);
    if (s.ok()) inode_->data.append(data.data(), data.size());
    return s;
  }
  absl::Status Sync() override {
    absl::MutexLock l(&fs_->mu_);
    absl::Status s = fs_->Enter(Op::kSync, path_);
    if (s.ok()) inode_->durable = inode_->data;
    return s;
  }
  absl::Status Close() override {
    absl::MutexLock l(&fs_->mu_);
    return fs_->Enter(Op::kClose, path_);
  }

 private:
  FaultInjectionFileSystem* const fs_;
  const std::string path_;
  const std::shared_ptr<Inode> inode_;
};

void FaultInjectionFileSystem::CrashAfter(int ops) {
  absl::MutexLock l(&mu_);
  crash_after_ = ops < 0 ? -1 : ops_ + ops;
}

void FaultInjectionFileSystem::FailNext(Op op, absl::Status status) {
  absl::MutexLock l(&mu_);
  fail_next_[op] = std::move(status);
}

void FaultInjectionFileSystem::Crash() {
  absl::MutexLock l(&mu_);
  entries_ = durable_entries_;
  for (auto& [name, inode] : entries_) inode->data = inode->durable;
  crash_after_ = -1;
  fail_next_.clear();
}

int FaultInjectionFileSystem::ops() const {
  absl::MutexLock l(&mu_);
  return ops_;
}

std::vector<std::string> FaultInjectionFileSystem::Files() const {
  absl::MutexLock l(&mu_);
  std::vector<std::string> out;
  for (const auto& [name, inode] : entries_) out.push_back(name);
  return out;
}

absl::Status FaultInjectionFileSystem::Enter(Op op, const std::string& path) {
  if (crash_after_ >= 0 && ops_ >= crash_after_) {
    return absl::UnavailableError(absl::StrCat("crashed before an operation on ", path));
  }
  auto it = fail_next_.find(op);
  if (it != fail_next_.end()) {
    absl::Status s = std::move(it->second);
    fail_next_.erase(it);
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  ++ops_;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionFileSystem::NewWritableFile(
    const std::string& path) {
  absl::MutexLock l(&mu_);
  if (!dirs_.count(DirName(path))) {
    return absl::NotFoundError(absl::StrCat("create ", path, ": no directory ", DirName(path)));
  }
  absl::Status s = Enter(Op::kCreate, path);
  if (!s.ok()) return s;
  auto inode = std::make_shared<Inode>();
  entries_[path] = inode;
  return std::unique_ptr<WritableFile>(new File(this, path, inode));
}

absl::Status FaultInjectionFileSystem::Rename(const std::string& from, const std::string& to) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(from);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("rename ", from, ": missing"));
  absl::Status s = Enter(Op::kRename, to);
  if (!s.ok()) return s;
  std::shared_ptr<Inode> inode = it->second;
  entries_.erase(it);
  entries_[to] = std::move(inode);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::SyncDir(const std::string& dir) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter(Op::kSyncDir, dir);
  if (!s.ok()) return s;
  // The directory's entries become what they are now: added, renamed and removed names alike.
  for (auto it = durable_entries_.begin(); it != durable_entries_.end();) {
    it = DirName(it->first) == dir ? durable_entries_.erase(it) : std::next(it);
  }
  for (const auto& [name, inode] : entries_) {
    if (DirName(name) == dir) durable_entries_[name] = inode;
  }
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::Remove(const std::string& path) {
  absl::MutexLock l(&mu_);
  if (!entries_.count(path)) {
    return absl::NotFoundError(absl::StrCat("remove ", path, ": missing"));
  }
  absl::Status s = Enter(Op::kRemove, path);
  if (!s.ok()) return s;
  entries_.erase(path);
  return absl::OkStatus();
}

absl::StatusOr<std::string> FaultInjectionFileSystem::ReadFile(const std::string& path) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(path);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("open ", path, ": missing"));
  return it->second->data;
}

absl::Status FaultInjectionFileSystem::MakeDirs(const std::string& dir) {
  absl::MutexLock l(&mu_);
  if (entries_.count(dir)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
  }
  if (dirs_.count(dir)) return absl::OkStatus();
  absl::Status s = Enter(Op::kMakeDirs, dir);
  if (!s.ok()) return s;
  for (std::string d = dir; d != "/" && d != "." && !dirs_.count(d); d = DirName(d)) {
    dirs_[d] = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FaultInjectionFileSystem::ListDir(
    const std::string& dir) {
  absl::MutexLock l(&mu_);
  if (!dirs_.count(dir)) return absl::NotFoundError(absl::StrCat("open directory ", dir));
  std::vector<std::string> names;
  for (const auto& [name, inode] : entries_) {
    if (DirName(name) == dir) names.push_back(name.substr(dir.size() + 1));
  }
  return names;
}

}  // namespace pscluster::testing
