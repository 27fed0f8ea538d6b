#include "server/client/tcp_conn.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_convert.h"
#include "proto/ps.pb.h"
#include "server/tcp_frame.h"
#include "server/wire.h"

namespace pscluster {
namespace {

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Connects with a timeout; returns the (blocking) socket or an error naming the address.
absl::StatusOr<int> Connect(const std::string& host, int port, absl::Duration timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string ps = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), ps.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  std::string error = "no address";
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (s < 0) continue;
    int r = connect(s, a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd p{s, POLLOUT, 0};
      int ms = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
      r = poll(&p, 1, ms);
      if (r == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
        r = err == 0 ? 0 : -1;
        errno = err;
      } else {
        if (r == 0) errno = ETIMEDOUT;
        r = -1;
      }
    }
    if (r == 0) {
      fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
      fd = s;
    } else {
      error = std::strerror(errno);
      close(s);
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", host, ":", port, ": ", error));
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::shared_ptr<TcpConn>> TcpConn::Open(const std::string& host, int port,
                                                       const std::string& peer,
                                                       absl::Duration connect_timeout,
                                                       absl::Duration send_timeout,
                                                       std::shared_ptr<BufferPool> pool) {
  auto fd = Connect(host, port, connect_timeout);
  if (!fd.ok()) {
    return absl::Status(fd.status().code(),
                        absl::StrCat("data port of ", peer, ": ", fd.status().message()));
  }
  TuneDataSocket(*fd, send_timeout);
  std::shared_ptr<TcpConn> c(new TcpConn(*fd, peer, std::move(pool)));
  c->reader_ = std::thread([p = c.get()] { p->ReadLoop(); });
  return c;
}

TcpConn::~TcpConn() {
  Break(absl::CancelledError(absl::StrCat("data connection to ", peer_, " closed")));
  if (reader_.joinable()) reader_.join();
  close(fd_);
}

absl::Status TcpConn::Send(const std::shared_ptr<Round>& round,
                           std::vector<grpc::ByteBuffer> messages) {
  {
    absl::MutexLock l(&mu_);
    if (closing_) {
      return absl::UnavailableError(absl::StrCat("data connection to ", peer_, " is closed"));
    }
    rounds_[round->request_id()] = round;
    for (auto& m : messages) writes_.push_back(std::move(m));
    if (writing_) return absl::OkStatus();  // The thread writing now sends these too.
    writing_ = true;
  }
  DrainWrites();
  return absl::OkStatus();
}

void TcpConn::DrainWrites() {
  while (true) {
    grpc::ByteBuffer msg;
    {
      absl::MutexLock l(&mu_);
      if (writes_.empty() || broken_) {
        writes_.clear();
        writing_ = false;
        break;
      }
      msg = std::move(writes_.front());
      writes_.pop_front();
    }
    absl::Status st;
    {
      auto frame = OutFrame::Message(msg);
      msg.Clear();
      st = frame.ok() ? frame->SendRest(fd_) : frame.status();
    }  // The frame lets go of the caller's memory here.
    if (!st.ok()) {
      Break(absl::UnavailableError(absl::StrCat("data connection to ", peer_, ": ", st.message())));
    }
  }
  MaybeHalfClose();
}

void TcpConn::ReadLoop() {
  absl::Status end;
  while (true) {
    auto h = ReadFrameHeader(fd_);
    if (!h.ok()) {
      end = absl::IsOutOfRange(h.status())
                ? absl::UnavailableError(absl::StrCat("data connection to ", peer_, " ended"))
                : absl::UnavailableError(absl::StrCat("data connection to ", peer_, ": ",
                                                      h.status().message()));
      break;
    }
    if (h->kind == kFrameStatus) {
      std::string text(h->length, '\0');
      absl::Status st = ReadFull(fd_, text.data(), text.size(), false, absl::Seconds(10));
      grpc::Status gs(static_cast<grpc::StatusCode>(h->aux), st.ok() ? text : "");
      end = FromGrpcStatus(gs, absl::StrCat("PushPull to ", peer_));
      if (end.ok()) end = absl::UnavailableError(absl::StrCat("stream to ", peer_, " ended"));
      break;
    }
    absl::Status st = ReadMessage(h->length, h->aux);
    if (!st.ok()) {
      end = absl::Status(st.code(), absl::StrCat("reply from ", peer_, ": ", st.message()));
      break;
    }
  }
  Break(end);
  absl::MutexLock l(&mu_);
  reader_done_ = true;
}

absl::Status TcpConn::ReadMessage(uint32_t length, uint32_t payload_bytes) {
  const absl::Duration stall = absl::Seconds(30);
  const size_t prefix_len = length - payload_bytes;
  prefix_.resize(prefix_len);
  absl::Status st = ReadFull(fd_, prefix_.data(), prefix_len, false, stall);
  if (!st.ok()) return st;
  // The prefix is the PullChunk without `values`, then (with a payload) that field's tag and
  // length; the payload bytes follow.
  size_t header_len = prefix_len;
  if (payload_bytes > 0) {
    const size_t trailer = 1 + VarintSize(payload_bytes);
    if (prefix_len < trailer ||
        static_cast<uint8_t>(prefix_[prefix_len - trailer]) !=
            ((kPullChunkValuesField << 3) | 2)) {
      return absl::InternalError("malformed PullChunk frame");
    }
    header_len -= trailer;
  }
  v1::PullChunk chunk;
  if (!chunk.ParseFromArray(prefix_.data(), static_cast<int>(header_len))) {
    return absl::InternalError("malformed PullChunk");
  }
  std::shared_ptr<Round> round;
  {
    absl::MutexLock l(&mu_);
    auto it = rounds_.find(chunk.request_id());
    if (it != rounds_.end()) {
      round = it->second;
      if (chunk.last()) rounds_.erase(it);
    }
  }
  const bool entered = round != nullptr && round->Enter(chunk);
  if (entered) {
    if (float* dst = round->DirectTarget(chunk, payload_bytes)) {
      st = ReadFull(fd_, dst, payload_bytes, false, stall);
      round->Received(st.ok() ? absl::OkStatus()
                              : absl::UnavailableError(absl::StrCat("receiving from ", peer_,
                                                                    ": ", st.message())));
      if (chunk.last()) MaybeHalfClose();
      return st;
    }
  }
  Payload values;
  if (payload_bytes > 0) {
    if (!entered) {
      st = Discard(fd_, payload_bytes, stall);
    } else {
      BufferPool::Buffer b = pool_->Acquire(payload_bytes);
      st = ReadFull(fd_, b.data, payload_bytes, false, stall);
      std::shared_ptr<BufferPool> pool = pool_;
      values = Payload({absl::string_view(b.data, payload_bytes)},
                       std::shared_ptr<const void>(b.data, [pool, b](const void*) {
                         pool->Release(b);
                       }));
    }
  }
  if (entered) {
    if (st.ok()) {
      round->Copy(chunk, values);
    } else {
      round->Received(absl::UnavailableError(absl::StrCat("receiving from ", peer_, ": ",
                                                          st.message())));
    }
  }
  if (chunk.last()) MaybeHalfClose();
  return st;
}

void TcpConn::MaybeHalfClose() {
  {
    absl::MutexLock l(&mu_);
    if (!retiring_ || half_closed_ || broken_ || writing_ || !rounds_.empty()) return;
    half_closed_ = true;
  }
  shutdown(fd_, SHUT_WR);  // The server finishes the stream and sends its status.
}

void TcpConn::Break(const absl::Status& st) {
  absl::flat_hash_map<uint64_t, std::shared_ptr<Round>> rounds;
  bool first;
  {
    absl::MutexLock l(&mu_);
    first = !broken_;
    broken_ = true;
    closing_ = true;
    rounds.swap(rounds_);
    if (!writing_) writes_.clear();  // A writing thread clears them itself.
  }
  if (first) shutdown(fd_, SHUT_RDWR);
  for (auto& [id, r] : rounds) r->Fail(st);
}

void TcpConn::Forget(uint64_t request_id) {
  {
    absl::MutexLock l(&mu_);
    rounds_.erase(request_id);
  }
  MaybeHalfClose();
}

void TcpConn::Cancel() {
  Break(absl::CancelledError(absl::StrCat("data connection to ", peer_, " cancelled")));
}

void TcpConn::Retire() {
  {
    absl::MutexLock l(&mu_);
    retiring_ = true;
    closing_ = true;
  }
  MaybeHalfClose();
}

void TcpConn::Shutdown(absl::Duration timeout) {
  Cancel();
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&reader_done_), timeout);
}

bool TcpConn::done() const {
  absl::MutexLock l(&mu_);
  return reader_done_;
}

bool TcpConn::usable() const {
  absl::MutexLock l(&mu_);
  return !closing_;
}

}  // namespace pscluster
