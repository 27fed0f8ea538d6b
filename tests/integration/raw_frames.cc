#include "tests/integration/raw_frames.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_convert.h"
#include "server/tcp_frame.h"

namespace pscluster::testing {

namespace {

// Connects `fd` to `a`, with a 10 s receive timeout; -1 and a test failure naming `what` if not.
int Connected(int fd, const sockaddr* a, socklen_t len, const std::string& what) {
  if (connect(fd, a, len) != 0) {
    ADD_FAILURE() << "connect to " << what << ": " << std::strerror(errno);
    close(fd);
    return -1;
  }
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

}  // namespace

int ConnectRaw(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  return Connected(socket(AF_INET, SOCK_STREAM, 0), reinterpret_cast<sockaddr*>(&a), sizeof(a),
                   "port " + std::to_string(port));
}

int ConnectUnixRaw(const std::string& name) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(a.sun_path) - 1);
  std::memcpy(a.sun_path + 1, name.data(), n);
  return Connected(socket(AF_UNIX, SOCK_STREAM, 0), reinterpret_cast<sockaddr*>(&a),
                   static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n), "@" + name);
}

std::string ReadChallenge(int fd, bool* required) {
  auto h = ReadFrameHeader(fd);
  if (!h.ok() || h->kind != kFrameChallenge || h->length != 32) {
    ADD_FAILURE() << "no challenge from the server: "
                  << (h.ok() ? absl::StrCat("kind ", h->kind) : h.status().ToString());
    return "";
  }
  std::string nonce(h->length, '\0');
  if (!ReadFull(fd, nonce.data(), nonce.size()).ok()) {
    ADD_FAILURE() << "challenge cut short";
    return "";
  }
  if (required != nullptr) *required = h->aux == 1;
  return nonce;
}

absl::Status SendAuth(int fd, const std::string& job, uint32_t worker, uint32_t attempt,
                      const std::string& proof) {
  return SendAuthBytes(fd, AuthFrame(job, worker, attempt, proof), /*end_writes=*/false);
}

absl::Status SendAuthBytes(int fd, const std::string& frame, bool end_writes) {
  if (send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(frame.size())) {
    return absl::UnavailableError("the auth frame was not taken");
  }
  if (end_writes) shutdown(fd, SHUT_WR);
  auto h = ReadFrameHeader(fd);
  if (!h.ok()) return absl::UnavailableError("closed");
  std::string body(h->length, '\0');
  if (!ReadFull(fd, body.data(), body.size()).ok()) return absl::UnavailableError("closed");
  if (h->kind == kFrameStatus) return StatusFromWire(h->aux, body, "");
  if (h->kind != kFrameAuth || h->aux != 1) {
    return absl::InternalError(absl::StrCat("answer of kind ", h->kind, " aux ", h->aux));
  }
  return absl::OkStatus();
}

namespace {

// Past the authentication exchange with no proof (-1 and a test failure when refused).
int Unauthenticated(int fd) {
  if (fd < 0) return fd;
  if (ReadChallenge(fd).empty()) {
    close(fd);
    return -1;
  }
  absl::Status st = SendAuth(fd, "", 0, 0, "");
  if (!st.ok()) {
    ADD_FAILURE() << "unauthenticated connection refused: " << st;
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int Connect(int port) { return Unauthenticated(ConnectRaw(port)); }

int ConnectUnix(const std::string& name) { return Unauthenticated(ConnectUnixRaw(name)); }

void SendAttach(int fd, int memfd, uint64_t request, uint64_t reply) {
  const std::string frame = AttachFrame(request, reply);
  ASSERT_EQ(SendWithFd(fd, frame, memfd, MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
}

void SendRaw(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

std::string Header(uint32_t magic, uint32_t kind, uint32_t length, uint32_t aux) {
  std::string h(kFrameHeaderBytes, '\0');
  uint32_t v[4] = {magic, kind, length, aux};
  std::memcpy(h.data(), v, sizeof(v));  // The test machines are little-endian, as the format.
  return h;
}

absl::Status ReadUntilStatus(int fd) {
  while (true) {
    auto h = ReadFrameHeader(fd);
    if (!h.ok()) return absl::UnavailableError("closed");
    std::string body(h->length, '\0');
    if (!ReadFull(fd, body.data(), body.size()).ok()) return absl::UnavailableError("closed");
    if (h->kind == kFrameStatus) {
      return StatusFromWire(h->aux, body, "");
    }
  }
}

}  // namespace pscluster::testing
