#include "common/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace pscluster {
namespace {

constexpr size_t kMaxHead = 16 * 1024;
constexpr size_t kMaxPending = 64;

void WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoding of a path; false on a malformed escape or a NUL.
bool DecodePath(absl::string_view in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    int hi = HexValue(in[i + 1]), lo = HexValue(in[i + 2]);
    if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

}  // namespace

const char* HttpServer::Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              Handler handler) {
  const std::string& address = options.address;
  size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.flag, ": '", address, "' must be host:port"));
  }
  std::string host = address.substr(0, colon);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0") {
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (host == "localhost") {
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.flag, ": '", host, "' is not an IPv4 address"));
  }
  if (options.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(options.flag, ": needs at least one thread"));
  }
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->options_ = options;
  s->handler_ = std::move(handler);
  s->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return absl::InternalError(absl::StrCat(options.flag, ": socket() failed"));
  int one = 1;
  ::setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::listen(s->listen_fd_, 64) != 0) {
    return absl::UnavailableError(absl::StrCat(options.flag, ": cannot listen on ", address, ": ",
                                               static_cast<const char*>(strerror(errno))));
  }
  socklen_t len = sizeof(sa);
  ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  s->port_ = ntohs(sa.sin_port);
  if (::pipe2(s->wake_pipe_, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat(options.flag, ": pipe failed"));
  }
  for (int i = 0; i < options.threads; ++i) s->servers_.emplace_back(&HttpServer::ServeLoop, s.get());
  s->acceptor_ = std::thread(&HttpServer::AcceptLoop, s.get());
  return s;
}

HttpServer::~HttpServer() {
  if (wake_pipe_[1] >= 0) {
    char c = 0;
    (void)!::write(wake_pipe_[1], &c, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : servers_) {
    if (t.joinable()) t.join();
  }
  absl::MutexLock l(&mu_);
  for (int fd : pending_) ::close(fd);
  pending_.clear();
  for (int fd : {listen_fd_, wake_pipe_[0], wake_pipe_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void HttpServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const int64_t ms = absl::ToInt64Milliseconds(options_.io_timeout);
    timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    absl::MutexLock l(&mu_);
    if (pending_.size() >= kMaxPending) {
      ::close(fd);  // Overloaded: the client retries.
      continue;
    }
    pending_.push_back(fd);
  }
}

void HttpServer::ServeLoop() {
  while (true) {
    int fd = -1;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !pending_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (pending_.empty()) return;  // Stopping.
      fd = pending_.front();
      pending_.pop_front();
    }
    Serve(fd);
    ::close(fd);
  }
}

void HttpServer::Serve(int fd) {
  std::string req;
  char buf[2048];
  while (req.size() <= kMaxHead && req.find("\r\n\r\n") == std::string::npos &&
         req.find("\n\n") == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    req.append(buf, static_cast<size_t>(n));
  }
  if (req.empty()) return;  // A connection opened and never used (browsers pre-open them).
  auto reply = [&](const HttpResponse& r, bool head_only) {
    std::string out = absl::StrCat("HTTP/1.0 ", r.status, " ", Reason(r.status),
                                   "\r\nContent-Type: ", r.content_type,
                                   "\r\nContent-Length: ", r.body.size(),
                                   "\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n");
    for (const auto& [name, value] : r.headers) absl::StrAppend(&out, name, ": ", value, "\r\n");
    out += "\r\n";
    if (!head_only) out += r.body;
    WriteAll(fd, out);
  };
  auto error = [&](int status, const std::string& text) {
    HttpResponse r;
    r.status = status;
    r.body = text + "\n";
    reply(r, false);
  };
  if (req.size() > kMaxHead) return error(431, "request head larger than 16 KiB");
  std::vector<absl::string_view> lines = absl::StrSplit(req, '\n');
  absl::string_view first = absl::StripTrailingAsciiWhitespace(lines[0]);
  std::vector<absl::string_view> parts = absl::StrSplit(first, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/") || parts[1].empty() ||
      parts[1][0] != '/') {
    return error(400, "bad request line");
  }
  HttpRequest r;
  r.method = std::string(parts[0]);
  if (r.method != "GET" && r.method != "HEAD") return error(405, "read-only: GET and HEAD only");
  absl::string_view target = parts[1];
  size_t q = target.find('?');
  if (q != absl::string_view::npos) {
    r.query = std::string(target.substr(q + 1));
    target = target.substr(0, q);
  }
  if (!DecodePath(target, &r.path)) return error(400, "malformed path");
  for (size_t i = 1; i < lines.size(); ++i) {
    absl::string_view line = absl::StripTrailingAsciiWhitespace(lines[i]);
    if (line.empty()) break;
    size_t colon = line.find(':');
    if (colon == absl::string_view::npos || colon == 0) return error(400, "malformed header");
    r.headers[absl::AsciiStrToLower(line.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  reply(handler_(r), r.method == "HEAD");
}

}  // namespace pscluster
