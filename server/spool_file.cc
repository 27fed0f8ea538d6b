#include "server/spool_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pscluster {

absl::StatusOr<std::shared_ptr<SpoolFile>> SpoolFile::Create(const std::string& dir,
                                                             const std::string& what) {
  std::string name = dir + "/.spool.XXXXXX";
  std::vector<char> path(name.begin(), name.end());
  path.push_back('\0');
  const int fd = mkostemp(path.data(), O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string why = absl::StrCat("cannot make a spool file for the ", what, " in ", dir,
                                         ": ", std::strerror(err));
    return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(why)
                                          : absl::FailedPreconditionError(why);
  }
  unlink(path.data());  // Anonymous from now on: freed when closed, whatever happens.
  return std::shared_ptr<SpoolFile>(new SpoolFile(fd, dir, what));
}

SpoolFile::~SpoolFile() { close(fd_); }

absl::Status SpoolFile::Append(absl::string_view data) {
  uint64_t at = size_.load(std::memory_order_relaxed);
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t r = pwrite(fd_, p, left, static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r < 0 ? errno : ENOSPC;
      const std::string why = absl::StrCat("writing the ", what_, " to a spool file in ", dir_,
                                           ": ", std::strerror(err));
      return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(why)
                                            : absl::InternalError(why);
    }
    p += r;
    left -= static_cast<size_t>(r);
    at += static_cast<uint64_t>(r);
  }
  size_.store(at, std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<absl::string_view> SpoolFile::Read(uint64_t offset, size_t n,
                                                  std::string* scratch) const {
  if (offset > size() || n > size() - offset) {
    return absl::DataLossError(absl::StrCat("the ", what_, " spooled in ", dir_, " holds ",
                                            size(), " bytes; ", n, " at ", offset,
                                            " were asked for"));
  }
  scratch->resize(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = pread(fd_, scratch->data() + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return absl::DataLossError(absl::StrCat("reading the ", what_, " spooled in ", dir_, ": ",
                                              r < 0 ? std::strerror(errno) : "short file"));
    }
    got += static_cast<size_t>(r);
  }
  return absl::string_view(scratch->data(), n);
}

}  // namespace pscluster
