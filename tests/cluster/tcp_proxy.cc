#include "tests/cluster/tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pscluster::testing {
namespace {

// Closes with a reset (SO_LINGER 0), as a connection cut by the network looks to the peer.
void Reset(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  close(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpProxy>> TcpProxy::Start(const std::string& upstream) {
  auto p = std::unique_ptr<TcpProxy>(new TcpProxy());
  size_t colon = upstream.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(upstream.substr(colon + 1), &p->upstream_port_)) {
    return absl::InvalidArgumentError(absl::StrCat("upstream '", upstream, "' is not host:port"));
  }
  p->upstream_host_ = upstream.substr(0, colon);
  if (p->upstream_host_ == "localhost") p->upstream_host_ = "127.0.0.1";
  p->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (p->listen_fd_ < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  int one = 1;
  setsockopt(p->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(p->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(p->listen_fd_, 64) != 0) {
    return absl::InternalError(absl::StrCat("bind/listen: ", strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  getsockname(p->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  p->port_ = ntohs(addr.sin_port);
  TcpProxy* raw = p.get();
  p->acceptor_ = std::thread([raw] { raw->AcceptLoop(); });
  return p;
}

TcpProxy::~TcpProxy() {
  stop_ = true;
  Cut();
  if (acceptor_.joinable()) acceptor_.join();
  close(listen_fd_);
  std::vector<std::thread> pumps;
  {
    absl::MutexLock l(&mu_);
    pumps.swap(pumps_);
  }
  for (auto& t : pumps) t.join();
}

std::string TcpProxy::address() const { return absl::StrCat("127.0.0.1:", port_); }

void TcpProxy::Cut() {
  cut_ = true;
  absl::MutexLock l(&mu_);
  // The pumps see their sockets fail and close them.
  for (int fd : open_) shutdown(fd, SHUT_RDWR);
}

void TcpProxy::Heal() { cut_ = false; }

void TcpProxy::AcceptLoop() {
  while (!stop_) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (poll(&pfd, 1, 50) <= 0) continue;
    int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    if (cut_) {
      Reset(client);
      continue;
    }
    int up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(upstream_port_));
    inet_pton(AF_INET, upstream_host_.c_str(), &addr.sin_addr);
    if (up < 0 || connect(up, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      if (up >= 0) close(up);
      Reset(client);
      continue;
    }
    int one = 1;
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(up, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    forwarded_.fetch_add(1);
    absl::MutexLock l(&mu_);
    open_.push_back(client);
    open_.push_back(up);
    const absl::Time start = absl::Now() + absl::Milliseconds(delay_ms_.load());
    pumps_.emplace_back([this, client, up, start] {
      while (absl::Now() < start && !stop_ && !cut_) absl::SleepFor(absl::Milliseconds(5));
      Pump(client, up);
    });
  }
}

void TcpProxy::Pump(int client, int upstream) {
  char buf[64 << 10];
  pollfd fds[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
  bool done = false;
  while (!done && !stop_ && !cut_) {
    if (poll(fds, 2, 50) <= 0) continue;
    for (int i = 0; i < 2 && !done; ++i) {
      if (fds[i].revents == 0) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        done = true;
        break;
      }
      const int to = fds[1 - i].fd;
      for (ssize_t off = 0; off < n;) {
        // MSG_NOSIGNAL: a peer gone meanwhile ends the pump, not the process (SIGPIPE).
        ssize_t w = send(to, buf + off, n - off, MSG_NOSIGNAL);
        if (w <= 0) {
          done = true;
          break;
        }
        off += w;
      }
    }
  }
  {
    absl::MutexLock l(&mu_);
    open_.erase(std::remove(open_.begin(), open_.end(), client), open_.end());
    open_.erase(std::remove(open_.begin(), open_.end(), upstream), open_.end());
  }
  Reset(client);
  Reset(upstream);
}

}  // namespace pscluster::testing
