#include "server/data_socket_io.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/tcp_frame.h"

namespace pscluster {

// Reads a frame header (blocking) with recvmsg(), taking a file descriptor passed with it
// (`*passed`, -1 when none). Only the first frame of a Unix connection may carry one.
absl::Status ReadHeaderWithFd(int fd, unsigned char* header, int* passed) {
  *passed = -1;
  size_t got = 0;
  while (got < kFrameHeaderBytes) {
    iovec v{header + got, kFrameHeaderBytes - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr m{};
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    ssize_t r = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int f;
        std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (*passed < 0) {
          *passed = f;
        } else {
          close(f);
        }
      }
    }
    if (r == 0) {
      if (got == 0) return absl::OutOfRangeError("end of stream");
      return absl::UnavailableError("recv: connection closed inside a frame");
    }
    got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

// "HOST:PORT" of a TCP peer, or "unix peer pid N" of a Unix one (for logs).
std::string PeerName(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "unknown peer";
  if (a.ss_family == AF_UNIX) {
    ucred cred{};
    socklen_t cl = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) return "unix peer";
    return absl::StrCat("unix peer pid ", cred.pid);
  }
  char host[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (a.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return absl::StrCat(host, ":", port);
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&a);
  inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
  port = ntohs(in6->sin6_port);
  return absl::StrCat("[", host, "]:", port);
}

}  // namespace pscluster
