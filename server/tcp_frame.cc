#include "server/tcp_frame.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pscluster {
namespace {

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

}  // namespace

uint64_t GetU64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

namespace {

absl::Status Errno(DataIo& io, const char* what) {
  const int err = errno;
  return absl::UnavailableError(absl::StrCat(what, ": ", io.ErrorText(err)));
}

// Waits until `io` is readable or `timeout` passed (false).
bool WaitReadable(DataIo& io, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return true;  // recv blocks by itself.
  if (io.HasPending()) return true;
  pollfd p{io.fd(), POLLIN, 0};
  int ms = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
  while (true) {
    int r = poll(&p, 1, ms);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // Let recv report the error.
  }
}

}  // namespace

absl::StatusOr<OutFrame> OutFrame::Message(const grpc::ByteBuffer& msg) {
  OutFrame f;
  grpc::Status st = msg.Dump(&f.slices_);
  if (!st.ok()) return absl::InternalError("cannot read an outgoing message's slices");
  size_t total = 0;
  for (const auto& s : f.slices_) total += s.size();
  if (total > kMaxFrameBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("message of ", total, " bytes exceeds the frame limit of ", kMaxFrameBytes));
  }
  const size_t tail = f.slices_.size() > 1 ? total - f.slices_[0].size() : 0;
  f.head_len_ = kFrameHeaderBytes;
  f.head_.reset(new char[f.head_len_]);
  PutU32(f.head_.get(), kTcpFrameMagic);
  PutU32(f.head_.get() + 4, kFrameMessage);
  PutU32(f.head_.get() + 8, static_cast<uint32_t>(total));
  PutU32(f.head_.get() + 12, static_cast<uint32_t>(tail));
  f.BuildIov();
  return f;
}

absl::StatusOr<OutFrame> OutFrame::Message(const grpc::ByteBuffer& msg, ShmRing* ring) {
  if (ring == nullptr) return Message(msg);
  OutFrame f;
  grpc::Status st = msg.Dump(&f.slices_);
  if (!st.ok()) return absl::InternalError("cannot read an outgoing message's slices");
  size_t total = 0;
  for (const auto& s : f.slices_) total += s.size();
  const size_t tail = f.slices_.size() > 1 ? total - f.slices_[0].size() : 0;
  if (tail < kShmMinPayloadBytes || total > kMaxFrameBytes) return Message(msg);
  std::optional<uint64_t> position = ring->Reserve(tail);
  if (!position.has_value()) return Message(msg);  // No room: inline.
  char* dst = ring->At(*position);
  for (size_t i = 1; i < f.slices_.size(); ++i) {
    std::memcpy(dst, f.slices_[i].begin(), f.slices_[i].size());
    dst += f.slices_[i].size();
  }
  f.slices_.resize(1);  // Lets go of the payload's memory.
  f.shm_bytes_ = tail;
  f.head_len_ = kFrameHeaderBytes;
  f.head_.reset(new char[kFrameHeaderBytes + kShmPositionBytes]);
  PutU32(f.head_.get(), kTcpFrameMagic);
  PutU32(f.head_.get() + 4, kFrameShmMessage);
  PutU32(f.head_.get() + 8, static_cast<uint32_t>(f.slices_[0].size() + kShmPositionBytes));
  PutU32(f.head_.get() + 12, static_cast<uint32_t>(tail));
  PutU64(f.head_.get() + kFrameHeaderBytes, *position);
  f.BuildIov();
  f.iov_.push_back({f.head_.get() + kFrameHeaderBytes, kShmPositionBytes});
  return f;
}

std::string AttachFrame(uint64_t request, uint64_t reply) {
  std::string f(kFrameHeaderBytes + 16, '\0');
  PutU32(f.data(), kTcpFrameMagic);
  PutU32(f.data() + 4, kFrameAttach);
  PutU32(f.data() + 8, 16);
  PutU64(f.data() + kFrameHeaderBytes, request);
  PutU64(f.data() + kFrameHeaderBytes + 8, reply);
  return f;
}

std::string AuthFrame(const std::string& job_id, uint32_t worker, uint32_t attempt,
                      const std::string& proof) {
  const size_t body = 8 + proof.size() + job_id.size();
  std::string f(kFrameHeaderBytes + 8, '\0');
  PutU32(f.data(), kTcpFrameMagic);
  PutU32(f.data() + 4, kFrameAuth);
  PutU32(f.data() + 8, static_cast<uint32_t>(body));
  PutU32(f.data() + 12, static_cast<uint32_t>(proof.size()));
  PutU32(f.data() + kFrameHeaderBytes, worker);
  PutU32(f.data() + kFrameHeaderBytes + 4, attempt);
  f += proof;
  f += job_id;
  return f;
}

absl::StatusOr<AuthClaim> ParseAuthBody(const std::string& body, uint32_t proof_bytes) {
  if (proof_bytes != 0 && proof_bytes != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth frame with a proof of ", proof_bytes, " bytes (0 or 32 expected)"));
  }
  if (body.size() < 8 + proof_bytes + (proof_bytes != 0 ? 1 : 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth frame of ", body.size(), " bytes: too short for its proof and job"));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(body.data());
  AuthClaim c;
  c.worker = GetU32(p);
  c.attempt = GetU32(p + 4);
  c.proof = body.substr(8, proof_bytes);
  c.job_id = body.substr(8 + proof_bytes);
  return c;
}

ssize_t SendWithFd(int fd, const std::string& bytes, int passed, int flags) {
  iovec v{const_cast<char*>(bytes.data()), bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  if (passed >= 0) {
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &passed, sizeof(int));
  }
  return sendmsg(fd, &m, flags);
}

OutFrame OutFrame::Raw(uint32_t kind, uint32_t aux, std::string body) {
  OutFrame f;
  f.head_len_ = kFrameHeaderBytes + body.size();
  f.head_.reset(new char[f.head_len_]);
  PutU32(f.head_.get(), kTcpFrameMagic);
  PutU32(f.head_.get() + 4, kind);
  PutU32(f.head_.get() + 8, static_cast<uint32_t>(body.size()));
  PutU32(f.head_.get() + 12, aux);
  if (!body.empty()) std::memcpy(f.head_.get() + kFrameHeaderBytes, body.data(), body.size());
  f.BuildIov();
  return f;
}

OutFrame OutFrame::Status(int code, const std::string& message) {
  OutFrame f;
  const size_t n = std::min<size_t>(message.size(), 64 << 10);
  f.head_len_ = kFrameHeaderBytes + n;
  f.head_.reset(new char[f.head_len_]);
  PutU32(f.head_.get(), kTcpFrameMagic);
  PutU32(f.head_.get() + 4, kFrameStatus);
  PutU32(f.head_.get() + 8, static_cast<uint32_t>(n));
  PutU32(f.head_.get() + 12, static_cast<uint32_t>(code));
  std::memcpy(f.head_.get() + kFrameHeaderBytes, message.data(), n);
  f.BuildIov();
  return f;
}

void OutFrame::BuildIov() {
  iov_.push_back({head_.get(), head_len_});
  for (const auto& s : slices_) {
    if (s.size() > 0) iov_.push_back({const_cast<uint8_t*>(s.begin()), s.size()});
  }
}

void OutFrame::Consume(size_t n) {
  while (n > 0 && iov_pos_ < iov_.size()) {
    iovec& v = iov_[iov_pos_];
    if (n >= v.iov_len) {
      n -= v.iov_len;
      v.iov_len = 0;
      ++iov_pos_;
    } else {
      v.iov_base = static_cast<char*>(v.iov_base) + n;
      v.iov_len -= n;
      n = 0;
    }
  }
}

absl::StatusOr<bool> OutFrame::SendSome(DataIo& io) {
  while (!sent()) {
    ssize_t r = io.Send(&iov_[iov_pos_], std::min<size_t>(iov_.size() - iov_pos_, IOV_MAX),
                        /*dontwait=*/true);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      return Errno(io, "send");
    }
    Consume(static_cast<size_t>(r));
  }
  const int flushed = io.Flush(/*dontwait=*/true);
  if (flushed < 0) return Errno(io, "send");
  return flushed == 1;
}

absl::Status OutFrame::SendRest(DataIo& io) {
  while (!sent()) {
    ssize_t r = io.Send(&iov_[iov_pos_], std::min<size_t>(iov_.size() - iov_pos_, IOV_MAX),
                        /*dontwait=*/false);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::DeadlineExceededError("send: the peer stopped reading");
      }
      return Errno(io, "send");
    }
    Consume(static_cast<size_t>(r));
  }
  const int flushed = io.Flush(/*dontwait=*/false);
  if (flushed == 0) return absl::DeadlineExceededError("send: the peer stopped reading");
  return flushed < 0 ? Errno(io, "send") : absl::OkStatus();
}

absl::Status ReadFull(DataIo& io, void* data, size_t n, bool eof_ok, absl::Duration stall) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    if (got > 0 && !WaitReadable(io, stall)) {
      return absl::DeadlineExceededError(
          absl::StrCat("recv: no data for ", absl::FormatDuration(stall), " inside a frame"));
    }
    ssize_t r = io.Recv(p + got, n - got, /*dontwait=*/false);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno(io, "recv");
    }
    if (r == 0) {
      if (got == 0 && eof_ok) return absl::OutOfRangeError("end of stream");
      return absl::UnavailableError("recv: connection closed inside a frame");
    }
    got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

absl::StatusOr<FrameHeader> ParseFrameHeader(const unsigned char* h) {
  if (GetU32(h) != kTcpFrameMagic) {
    return absl::InvalidArgumentError("not a pscluster data-plane frame (bad magic)");
  }
  FrameHeader f;
  f.kind = GetU32(h + 4);
  f.length = GetU32(h + 8);
  f.aux = GetU32(h + 12);
  if (f.kind < kFrameMessage || f.kind > kFrameAuth) {
    return absl::InvalidArgumentError(absl::StrCat("unknown frame kind ", f.kind));
  }
  if (f.kind == kFrameShmMessage &&
      (f.length < kShmPositionBytes || f.aux > kMaxFrameBytes - (f.length - kShmPositionBytes))) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad shared-memory frame (", f.length, " bytes, payload ", f.aux, ")"));
  }
  if (f.length > kMaxFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("frame of ", f.length,
                                                   " bytes exceeds the limit of ", kMaxFrameBytes));
  }
  if (f.kind == kFrameMessage && f.aux > f.length) {
    return absl::InvalidArgumentError("frame payload longer than the frame");
  }
  return f;
}

absl::StatusOr<FrameHeader> ReadFrameHeader(int fd) {
  unsigned char h[kFrameHeaderBytes];
  absl::Status st = ReadFull(fd, h, sizeof(h), /*eof_ok=*/true, absl::Seconds(30));
  if (!st.ok()) return st;
  return ParseFrameHeader(h);
}

absl::Status FrameReader::Read(void* data, size_t n, bool eof_ok, absl::Duration stall) {
  char* out = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    if (pos_ < end_) {
      const size_t k = std::min(n - got, end_ - pos_);
      std::memcpy(out + got, buf_.data() + pos_, k);
      pos_ += k;
      got += k;
      continue;
    }
    if (n - got >= buf_.size() / 4) {
      // Large: straight into place.
      absl::Status st = ReadFull(*io_, out + got, n - got, eof_ok && got == 0, stall);
      if (!st.ok() && got > 0 && absl::IsOutOfRange(st)) {
        return absl::UnavailableError("recv: connection closed inside a frame");
      }
      return st;
    }
    if (got > 0 && !WaitReadable(*io_, stall)) {
      return absl::DeadlineExceededError(
          absl::StrCat("recv: no data for ", absl::FormatDuration(stall), " inside a frame"));
    }
    ssize_t r = -1;
    if (spin_ > absl::ZeroDuration()) {
      const absl::Time until = absl::Now() + spin_;
      while (true) {
        r = io_->Recv(buf_.data(), buf_.size(), /*dontwait=*/true);
        if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || absl::Now() >= until) break;
        sched_yield();  // Other work on this core goes first.
      }
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) r = -2;  // Sleep below.
    }
    if (r == -2 || spin_ <= absl::ZeroDuration()) {
      r = io_->Recv(buf_.data(), buf_.size(), /*dontwait=*/false);
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno(*io_, "recv");
    }
    if (r == 0) {
      if (got == 0 && eof_ok) return absl::OutOfRangeError("end of stream");
      return absl::UnavailableError("recv: connection closed inside a frame");
    }
    pos_ = 0;
    end_ = static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

absl::Status Discard(int fd, size_t n, absl::Duration stall) {
  char buf[64 << 10];
  while (n > 0) {
    size_t k = std::min(n, sizeof(buf));
    absl::Status st = ReadFull(fd, buf, k, false, stall);
    if (!st.ok()) return st;
    n -= k;
  }
  return absl::OkStatus();
}

void TuneDataSocket(int fd, absl::Duration send_timeout) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  if (send_timeout != absl::InfiniteDuration()) {
    timeval tv = absl::ToTimeval(send_timeout);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
}

void TuneUnixDataSocket(int fd) {
  int bytes = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

absl::Status SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  if (!address.empty() && address[0] == '[') {
    size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("malformed address \"", address, "\""));
    }
    *host = address.substr(1, close - 1);
    *port = address.substr(close + 2);
    return absl::OkStatus();
  }
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\" is not host:port"));
  }
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  return absl::OkStatus();
}

}  // namespace pscluster
