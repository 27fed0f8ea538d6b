#include "scheduler/metrics_http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"

namespace pscluster::scheduler {
namespace {

constexpr size_t kMaxRequest = 8192;
constexpr int kReadTimeoutMs = 2000;

void WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += n;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, std::function<std::string()> render) {
  size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen: '", address, "' must be host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res) != 0 ||
      res == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen: cannot resolve '", host, "'"));
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 16) != 0) {
    std::string err = strerror(errno);
    freeaddrinfo(res);
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("--metrics_listen: cannot listen on ", address, ": ", err));
  }
  freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->listen_fd_ = fd;
  s->port_ = ntohs(bound.ss_family == AF_INET6
                       ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                       : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  s->render_ = std::move(render);
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void MetricsHttpServer::Serve() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Handle(fd);
    close(fd);
  }
}

void MetricsHttpServer::Handle(int fd) {
  std::string req;
  char buf[1024];
  while (req.size() < kMaxRequest && req.find("\r\n\r\n") == std::string::npos &&
         req.find("\n\n") == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, kReadTimeoutMs) <= 0) return;
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    req.append(buf, n);
  }
  if (absl::StartsWith(req, "GET /metrics ") || absl::StartsWith(req, "GET /metrics?")) {
    std::string body = render_();
    WriteAll(fd, absl::StrCat("HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                              "Content-Length: ",
                              body.size(), "\r\nConnection: close\r\n\r\n", body));
  } else {
    std::string body = "not found: the metrics are at /metrics\n";
    WriteAll(fd, absl::StrCat("HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\n"
                              "Content-Length: ",
                              body.size(), "\r\nConnection: close\r\n\r\n", body));
  }
}

}  // namespace pscluster::scheduler
