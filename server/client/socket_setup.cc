#include "server/client/socket_setup.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

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
absl::Status SendAll(int fd, const std::string& bytes, int passed, absl::Time deadline,
                     const std::string& peer, const char* what) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    // The memfd must travel with the frame's first bytes: sent all or nothing while it is due.
    const int flags = MSG_NOSIGNAL | MSG_DONTWAIT;
    const ssize_t r = passed >= 0 ? SendWithFd(fd, bytes, passed, flags)
                                  : send(fd, bytes.data() + sent, bytes.size() - sent, flags);
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
          absl::StrCat("data socket of ", peer, ": ", what, ": ", std::strerror(errno)));
    }
    absl::Status st = WaitFor(fd, POLLOUT, deadline, peer, what);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// Receives exactly `n` bytes into `out`.
absl::Status RecvAll(int fd, char* out, size_t n, absl::Time deadline, const std::string& peer,
                     const char* what) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, out + got, n - got, MSG_DONTWAIT);
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
          absl::StrCat("data socket of ", peer, ": ", what, ": ", std::strerror(errno)));
    }
    absl::Status st = WaitFor(fd, POLLIN, deadline, peer, what);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// Reads one frame header and, up to `max_body` bytes, its body.
absl::StatusOr<FrameHeader> RecvFrame(int fd, std::string* body, size_t max_body,
                                      absl::Time deadline, const std::string& peer,
                                      const char* what) {
  char hb[kFrameHeaderBytes];
  absl::Status st = RecvAll(fd, hb, sizeof(hb), deadline, peer, what);
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
  st = RecvAll(fd, body->data(), body->size(), deadline, peer, what);
  if (!st.ok()) return st;
  return h;
}

}  // namespace

absl::Status AuthenticateDataSocket(int fd, const DataAuth& auth, const std::string& peer) {
  const absl::Time deadline = absl::Now() + kSetupTimeout;
  std::string nonce;
  absl::StatusOr<FrameHeader> h =
      RecvFrame(fd, &nonce, kDataNonceBytes, deadline, peer, "authentication challenge");
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
  absl::Status st = SendAll(fd, AuthFrame(auth.job_id, auth.worker, auth.attempt, proof), -1,
                            deadline, peer, "auth frame");
  if (!st.ok()) return st;
  std::string text;
  h = RecvFrame(fd, &text, 64 << 10, deadline, peer, "answer to the auth frame");
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
  absl::Status st = SendAll(fd, AttachFrame(area.request_bytes(), area.reply_bytes()), area.fd(),
                            deadline, peer, "shared-memory offer");
  if (!st.ok()) return st;
  std::string body;
  absl::StatusOr<FrameHeader> h =
      RecvFrame(fd, &body, 0, deadline, peer, "answer to the shared-memory offer");
  if (!h.ok()) return h.status();
  if (h->kind != kFrameAttach) {
    return absl::InternalError(absl::StrCat("data socket of ", peer,
                                            ": unexpected answer to the shared-memory offer"));
  }
  return h->aux == 1;
}

}  // namespace pscluster
