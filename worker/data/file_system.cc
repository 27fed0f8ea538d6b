#include "worker/data/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pscluster::data {
namespace {

absl::Status ErrnoError(int err, const std::string& path, const char* what) {
  if (err == ENOENT || err == ENOTDIR) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
  }
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat(path, ": ", what, ": ", std::strerror(err)));
}

class PosixFile final : public RandomAccessFile {
 public:
  PosixFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixFile() override { ::close(fd_); }

  absl::StatusOr<size_t> Read(uint64_t offset, size_t n, char* buf) override {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_, buf + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, path_, "read");
      }
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    return done;
  }

 private:
  const int fd_;
  const std::string path_;
};

class PosixFileSystem final : public FileSystem {
 public:
  absl::StatusOr<FileStat> Stat(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoError(errno, path, "stat");
    FileStat out;
    out.is_dir = S_ISDIR(st.st_mode);
    out.size = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
    return out;
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoError(errno, dir, "list");
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        names.emplace_back(e->d_name);
      }
    }
    ::closedir(d);
    return names;
  }

  absl::StatusOr<std::vector<std::string>> Glob(const std::string& pattern) override {
    glob_t g;
    std::memset(&g, 0, sizeof(g));
    const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
    std::vector<std::string> out;
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    }
    ::globfree(&g);
    if (rc != 0 && rc != GLOB_NOMATCH) {
      return absl::UnavailableError(absl::StrCat(
          pattern, ": cannot expand the pattern (",
          rc == GLOB_ABORTED ? "a directory could not be read" : "out of memory", ")"));
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, path, "open");
    // The readers go through each range once, front to back.
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    return std::unique_ptr<RandomAccessFile>(new PosixFile(fd, path));
  }
};

}  // namespace

std::unique_ptr<FileSystem> NewPosixFileSystem() { return std::make_unique<PosixFileSystem>(); }

}  // namespace pscluster::data
