#include "server/client/socket_setup.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/tcp_frame.h"

namespace pscluster {
namespace {

constexpr absl::Duration kSetupTimeout = absl::Seconds(10);

// Waits until `fd` has `events` or `deadline` passes (DEADLINE_EXCEEDED naming `what`).
absl::Status WaitFor(int fd, short events, absl::Time deadline, const std::string& peer,
                     const char* what) {
  pollfd p{fd, events, 0};
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  if (ms <= 0 || poll(&p, 1, static_cast<int>(ms)) <= 0) {
    return absl::DeadlineExceededError(absl::StrCat("data socket of ", peer, ": no ", what,
                                                    " within ",
                                                    absl::FormatDuration(kSetupTimeout)));
  }
  return absl::OkStatus();
}

// Sends all of `bytes` (with `passed` as SCM_RIGHTS on the first piece when >= 0).
absl::Status SendAll(DataIo& io, const std::string& bytes, int passed, absl::Time deadline,
                     const std::string& peer, const char* what) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    // The memfd must travel with the frame's first bytes: sent all or nothing while it is due.
    const int flags = MSG_NOSIGNAL | MSG_DONTWAIT;
    iovec rest{const_cast<char*>(bytes.data()) + sent, bytes.size() - sent};
    const ssize_t r = passed >= 0 ? SendWithFd(io.fd(), bytes, passed, flags)
                                  : io.Send(&rest, 1, /*dontwait=*/true);
    if (r > 0 && passed >= 0 && static_cast<size_t>(r) != bytes.size()) {
      return absl::UnavailableError(
          absl::StrCat("data socket of ", peer, ": ", what, " sent in part"));
    }
    if (r > 0) {
      sent += static_cast<size_t>(r);
      passed = -1;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(
          absl::StrCat("data socket of ", peer, ": ", what, ": ", io.ErrorText(errno)));
    }
    absl::Status st = WaitFor(io.fd(), POLLOUT, deadline, peer, what);
    if (!st.ok()) return st;
  }
  while (true) {  // What TLS kept back.
    const int flushed = io.Flush(/*dontwait=*/true);
    if (flushed == 1) return absl::OkStatus();
    if (flushed < 0) {
      return absl::UnavailableError(
          absl::StrCat("data socket of ", peer, ": ", what, ": ", io.ErrorText(errno)));
    }
    absl::Status st = WaitFor(io.fd(), POLLOUT, deadline, peer, what);
    if (!st.ok()) return st;
  }
}

// Receives exactly `n` bytes into `out`.
absl::Status RecvAll(DataIo& io, char* out, size_t n, absl::Time deadline,
                     const std::string& peer, const char* what) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = io.Recv(out + got, n - got, /*dontwait=*/true);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      return absl::UnavailableError(
          absl::StrCat("data socket of ", peer, ": closed by the server before its ", what));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(
          absl::StrCat("data socket of ", peer, ": ", what, ": ", io.ErrorText(errno)));
    }
    if (io.HasPending()) continue;
    absl::Status st = WaitFor(io.fd(), POLLIN, deadline, peer, what);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// Reads one frame header and, up to `max_body` bytes, its body.
absl::StatusOr<FrameHeader> RecvFrame(DataIo& io, std::string* body, size_t max_body,
                                      absl::Time deadline, const std::string& peer,
                                      const char* what) {
  char hb[kFrameHeaderBytes];
  absl::Status st = RecvAll(io, hb, sizeof(hb), deadline, peer, what);
  if (!st.ok()) return st;
  absl::StatusOr<FrameHeader> h = ParseFrameHeader(reinterpret_cast<unsigned char*>(hb));
  if (!h.ok()) {
    return absl::InternalError(
        absl::StrCat("data socket of ", peer, ": ", what, ": ", h.status().message()));
  }
  if (h->length > max_body) {
    return absl::InternalError(absl::StrCat("data socket of ", peer, ": ", what, " of ",
                                            h->length, " bytes"));
  }
  body->assign(h->length, '\0');
  st = RecvAll(io, body->data(), body->size(), deadline, peer, what);
  if (!st.ok()) return st;
  return h;
}

}  // namespace

absl::Status AuthenticateDataSocket(DataIo& io, const DataAuth& auth, const std::string& peer) {
  const absl::Time deadline = absl::Now() + kSetupTimeout;
  std::string nonce;
  absl::StatusOr<FrameHeader> h =
      RecvFrame(io, &nonce, kDataNonceBytes, deadline, peer, "authentication challenge");
  if (!h.ok()) return h.status();
  if (h->kind != kFrameChallenge || nonce.size() != kDataNonceBytes) {
    return absl::InternalError(absl::StrCat(
        "data socket of ", peer, ": expected an authentication challenge, got a frame of kind ",
        h->kind));
  }
  if (h->aux == 1 && auth.secret.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "data socket of ", peer, ": the server requires a proof of job ", auth.job_id,
        "'s data secret and this client has none"));
  }
  const std::string proof =
      auth.secret.empty()
          ? std::string()
          : DataAuthProof(auth.secret, nonce, auth.job_id, auth.worker, auth.attempt);
  absl::Status st = SendAll(io, AuthFrame(auth.job_id, auth.worker, auth.attempt, proof), -1,
                            deadline, peer, "auth frame");
  if (!st.ok()) return st;
  std::string text;
  h = RecvFrame(io, &text, 64 << 10, deadline, peer, "answer to the auth frame");
  if (!h.ok()) return h.status();
  if (h->kind == kFrameStatus) {
    return absl::Status(static_cast<absl::StatusCode>(h->aux),
                        absl::StrCat("data socket of ", peer, ": ", text));
  }
  if (h->kind != kFrameAuth || h->aux != 1) {
    return absl::InternalError(
        absl::StrCat("data socket of ", peer, ": unexpected answer to the auth frame"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> OfferSharedMemory(int fd, const ShmArea& area, const std::string& peer) {
  const absl::Time deadline = absl::Now() + kSetupTimeout;
  DataIo io(fd);
  absl::Status st = SendAll(io, AttachFrame(area.request_bytes(), area.reply_bytes()), area.fd(),
                            deadline, peer, "shared-memory offer");
  if (!st.ok()) return st;
  std::string body;
  absl::StatusOr<FrameHeader> h =
      RecvFrame(io, &body, 0, deadline, peer, "answer to the shared-memory offer");
  if (!h.ok()) return h.status();
  if (h->kind != kFrameAttach) {
    return absl::InternalError(absl::StrCat("data socket of ", peer,
                                            ": unexpected answer to the shared-memory offer"));
  }
  return h->aux == 1;
}

absl::StatusOr<int> ConnectTcp(const std::string& host, int port, absl::Duration timeout) {
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

bool IsLocalHost(const std::string& host) {
  if (host == "localhost") return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) {
    hints.ai_flags = 0;  // A name: resolve it.
    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  }
  ifaddrs* ifs = nullptr;
  getifaddrs(&ifs);
  bool local = false;
  for (addrinfo* a = res; a != nullptr && !local; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const in_addr ip = reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr;
      if ((ntohl(ip.s_addr) >> 24) == 127) local = true;
      for (ifaddrs* i = ifs; i != nullptr && !local; i = i->ifa_next) {
        if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
            reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == ip.s_addr) {
          local = true;
        }
      }
    } else if (a->ai_family == AF_INET6) {
      const in6_addr ip = reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr;
      if (IN6_IS_ADDR_LOOPBACK(&ip)) local = true;
      for (ifaddrs* i = ifs; i != nullptr && !local; i = i->ifa_next) {
        if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET6 &&
            std::memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, &ip,
                        sizeof(ip)) == 0) {
          local = true;
        }
      }
    }
  }
  if (ifs) freeifaddrs(ifs);
  freeaddrinfo(res);
  return local;
}

absl::StatusOr<std::unique_ptr<DataIo>> SetUpDataSocket(int fd, const std::string& host,
                                                        const TlsContext* tls,
                                                        absl::Duration timeout,
                                                        const DataAuth& auth,
                                                        const std::string& peer) {
  std::unique_ptr<DataIo> io;
  if (tls == nullptr) {
    io = std::make_unique<DataIo>(fd);
  } else {
    auto t = std::make_unique<TlsIo>(fd, *tls, host);
    absl::Status st = t->Handshake(absl::Now() + timeout);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("data port of ", peer, ": ", st.message()));
    }
    io = std::move(t);
  }
  absl::Status st = AuthenticateDataSocket(*io, auth, peer);
  if (!st.ok()) return st;
  return io;
}

}  // namespace pscluster
