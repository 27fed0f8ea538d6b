#include "server/shm_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace pscluster {
namespace {

// Control page layout (each counter on its own cache line).
constexpr size_t kMagicAt = 0;
constexpr size_t kRequestSizeAt = 8;
constexpr size_t kReplySizeAt = 16;
constexpr size_t kRequestConsumedAt = 64;
constexpr size_t kReplyConsumedAt = 128;

uint64_t* Word(char* base, size_t at) { return reinterpret_cast<uint64_t*>(base + at); }

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

std::optional<uint64_t> ShmRing::Reserve(size_t n) {
  if (n == 0 || n > size_) return std::nullopt;
  // The reader's counter, clamped: it cannot have consumed what was never written.
  uint64_t consumed = __atomic_load_n(consumed_, __ATOMIC_ACQUIRE);
  if (consumed > head_) consumed = head_;
  // The reader stops at the end of the last payload before a restart; the skipped rest of the
  // ring was never written, so it counts as read.
  if (consumed == gap_from_) consumed = gap_to_;
  uint64_t start;
  if (consumed == head_) {
    // Everything was read: start over at the ring's beginning, whose cache lines are the ones
    // most recently used (walking the whole ring would stream payloads through cold memory).
    start = RoundUp(head_, size_);
    gap_from_ = head_;
    gap_to_ = start;
  } else {
    start = RoundUp(head_, 64);
    const size_t pos = start % size_;
    if (pos + n > size_) start += size_ - pos;  // Never wrap a payload: skip the ring's end.
    // Unread bytes lie within [consumed, head_) (less any skipped gap): stay clear of them.
    if (start + n - consumed > size_) return std::nullopt;
  }
  head_ = start + n;
  return start;
}

absl::StatusOr<const char*> ShmRing::Locate(uint64_t position, size_t n) const {
  const uint64_t pos = position % size_;
  if (n > size_ || pos + n > size_) {
    return absl::InvalidArgumentError(absl::StrCat("payload of ", n, " bytes at ring position ",
                                                   position, " does not lie in the ring of ",
                                                   size_, " bytes"));
  }
  return base_ + pos;
}

void ShmRing::Release(uint64_t position, size_t n) {
  __atomic_store_n(consumed_, position + n, __ATOMIC_RELEASE);
}

ShmArea::ShmArea(int fd, char* base, size_t request_bytes, size_t reply_bytes)
    : fd_(fd),
      base_(base),
      request_bytes_(request_bytes),
      reply_bytes_(reply_bytes),
      request_(base + kShmControlBytes, request_bytes, Word(base, kRequestConsumedAt)),
      reply_(base + kShmControlBytes + request_bytes, reply_bytes, Word(base, kReplyConsumedAt)) {}

ShmArea::~ShmArea() {
  munmap(base_, kShmControlBytes + request_bytes_ + reply_bytes_);
  close(fd_);
}

absl::StatusOr<std::unique_ptr<ShmArea>> ShmArea::Create(size_t request_bytes,
                                                         size_t reply_bytes) {
  request_bytes = RoundUp(std::max<size_t>(request_bytes, 1), 64 << 10);
  reply_bytes = RoundUp(std::max<size_t>(reply_bytes, 1), 64 << 10);
  const size_t total = kShmControlBytes + request_bytes + reply_bytes;
  int fd = memfd_create("pscluster-data", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  if (ftruncate(fd, static_cast<off_t>(total)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("shared memory of ", total, " bytes: ", std::strerror(err)));
  }
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("mmap of ", total, " bytes: ", std::strerror(err)));
  }
  char* base = static_cast<char*>(p);
  *Word(base, kMagicAt) = kShmMagic;
  *Word(base, kRequestSizeAt) = request_bytes;
  *Word(base, kReplySizeAt) = reply_bytes;
  return std::unique_ptr<ShmArea>(new ShmArea(fd, base, request_bytes, reply_bytes));
}

absl::StatusOr<std::unique_ptr<ShmArea>> ShmArea::Attach(int fd, uint64_t request_bytes,
                                                         uint64_t reply_bytes, size_t max_bytes) {
  auto refuse = [fd](std::string why) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shared memory refused: ", why));
  };
  if (request_bytes == 0 || reply_bytes == 0 || request_bytes % 64 != 0 ||
      reply_bytes % 64 != 0 || request_bytes > max_bytes || reply_bytes > max_bytes ||
      kShmControlBytes + request_bytes + reply_bytes > max_bytes) {
    return refuse(absl::StrCat("rings of ", request_bytes, " and ", reply_bytes,
                               " bytes (the limit is ", max_bytes, " bytes in all)"));
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return refuse("the memory is not sealed against shrinking");
  }
  struct stat sb {};
  const uint64_t total = kShmControlBytes + request_bytes + reply_bytes;
  if (fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) != total) {
    return refuse(absl::StrCat("the memory holds ", sb.st_size, " bytes, not ", total));
  }
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return refuse(absl::StrCat("mmap: ", std::strerror(errno)));
  char* base = static_cast<char*>(p);
  if (*Word(base, kMagicAt) != kShmMagic || *Word(base, kRequestSizeAt) != request_bytes ||
      *Word(base, kReplySizeAt) != reply_bytes) {
    munmap(p, total);
    return refuse("its control page does not match the attach frame");
  }
  return std::unique_ptr<ShmArea>(new ShmArea(fd, base, request_bytes, reply_bytes));
}

}  // namespace pscluster
