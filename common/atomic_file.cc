#include "common/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace pscluster {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path, int err) {
  std::string msg = absl::StrCat(what, " ", path, ": ", static_cast<const char*>(strerror(err)));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    case ENOTDIR:       // A path component is a file.
    case EISDIR:        // A file path names a directory.
    case ENAMETOOLONG:
    case ELOOP:
      return absl::InvalidArgumentError(msg);  // The caller's path is unusable.
    case EROFS:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write", path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view data) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("create", tmp, errno);
  absl::Status s = WriteAll(fd, data, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoError("fsync", tmp, errno);
  if (::close(fd) != 0 && s.ok()) s = ErrnoError("close", tmp, errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoError("rename to", path, errno);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  std::string dir = DirName(path);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoError("open directory", dir, errno);
  int rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  if (rc != 0) return ErrnoError("fsync directory", dir, err);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path, errno);
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoError("read", path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("MakeDirs: empty directory name");
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    partial = dir.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError("mkdir", partial, errno);
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoError("stat", dir, errno);
  if (!S_ISDIR(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
  return absl::OkStatus();
}

}  // namespace pscluster
