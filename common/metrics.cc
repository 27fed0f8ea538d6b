#include "common/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pscluster {
namespace {

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.17g", v);
}

void WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  const size_t i = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  double cur = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
  count_.fetch_add(1, std::memory_order_relaxed);
}

uint64_t Histogram::cumulative(size_t i) const {
  uint64_t n = 0;
  for (size_t j = 0; j <= std::min(i, bounds_.size()); ++j) {
    n += buckets_[j].load(std::memory_order_relaxed);
  }
  return n;
}

std::vector<double> LatencyBuckets() {
  return {25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
          25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};
}

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         const std::string& labels, std::vector<double> bounds) {
  auto h = std::make_unique<Histogram>(std::move(bounds));
  Histogram* out = h.get();
  absl::MutexLock l(&mu_);
  for (auto& f : families_) {
    if (f->name == name && f->type == "histogram") {
      f->histograms.emplace_back(labels, std::move(h));
      return out;
    }
  }
  auto f = std::make_unique<Family>();
  f->name = name;
  f->help = help;
  f->type = "histogram";
  f->histograms.emplace_back(labels, std::move(h));
  families_.push_back(std::move(f));
  return out;
}

Counter* MetricsRegistry::AddCounter(const std::string& name, const std::string& help) {
  auto f = std::make_unique<Family>();
  f->name = name;
  f->help = help;
  f->type = "counter";
  f->counter = std::make_unique<Counter>();
  Counter* c = f->counter.get();
  absl::MutexLock l(&mu_);
  families_.push_back(std::move(f));
  return c;
}

Gauge* MetricsRegistry::AddGauge(const std::string& name, const std::string& help) {
  auto f = std::make_unique<Family>();
  f->name = name;
  f->help = help;
  f->type = "gauge";
  f->gauge = std::make_unique<Gauge>();
  Gauge* g = f->gauge.get();
  absl::MutexLock l(&mu_);
  families_.push_back(std::move(f));
  return g;
}

void MetricsRegistry::AddGaugeCallback(const std::string& name, const std::string& help,
                                       std::function<std::vector<Sample>()> fn) {
  auto f = std::make_unique<Family>();
  f->name = name;
  f->help = help;
  f->type = "gauge";
  f->fn = std::move(fn);
  absl::MutexLock l(&mu_);
  families_.push_back(std::move(f));
}

void MetricsRegistry::AddCounterCallback(const std::string& name, const std::string& help,
                                         std::function<std::vector<Sample>()> fn) {
  auto f = std::make_unique<Family>();
  f->name = name;
  f->help = help;
  f->type = "counter";
  f->fn = std::move(fn);
  absl::MutexLock l(&mu_);
  families_.push_back(std::move(f));
}

std::string MetricsRegistry::Render() const {
  std::string out;
  absl::MutexLock l(&mu_);
  for (const auto& f : families_) {
    absl::StrAppend(&out, "# HELP ", f->name, " ", f->help, "\n# TYPE ", f->name, " ", f->type,
                    "\n");
    if (f->counter) absl::StrAppend(&out, f->name, " ", FormatValue(f->counter->value()), "\n");
    if (f->gauge) absl::StrAppend(&out, f->name, " ", FormatValue(f->gauge->value()), "\n");
    for (const auto& [labels, h] : f->histograms) {
      const std::string sep = labels.empty() ? "" : ",";
      // Read the count last: every bucket then holds at most what it says.
      std::vector<uint64_t> cum(h->bounds().size() + 1);
      for (size_t i = 0; i < cum.size(); ++i) cum[i] = h->cumulative(i);
      const double sum = h->sum();
      const uint64_t count = std::max(h->count(), cum.back());
      for (size_t i = 0; i < h->bounds().size(); ++i) {
        absl::StrAppend(&out, f->name, "_bucket{", labels, sep, "le=\"",
                        absl::StrCat(h->bounds()[i]), "\"} ", cum[i], "\n");
      }
      absl::StrAppend(&out, f->name, "_bucket{", labels, sep, "le=\"+Inf\"} ", count, "\n");
      const std::string braces = labels.empty() ? "" : absl::StrCat("{", labels, "}");
      absl::StrAppend(&out, f->name, "_sum", braces, " ", FormatValue(sum), "\n", f->name,
                      "_count", braces, " ", count, "\n");
    }
    if (f->fn) {
      for (const Sample& s : f->fn()) {
        absl::StrAppend(&out, f->name, s.labels.empty() ? "" : "{", s.labels,
                        s.labels.empty() ? "" : "}", " ", FormatValue(s.value), "\n");
      }
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, const MetricsRegistry* registry) {
  size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics_listen: '", address,
                                                   "' must be host:port"));
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
    return absl::InvalidArgumentError(absl::StrCat("--metrics_listen: '", host,
                                                   "' is not an IPv4 address"));
  }
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->registry_ = registry;
  s->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return absl::InternalError("metrics: socket() failed");
  int one = 1;
  ::setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::listen(s->listen_fd_, 16) != 0) {
    return absl::UnavailableError(absl::StrCat("--metrics_listen: cannot listen on ", address,
                                               ": ", static_cast<const char*>(strerror(errno))));
  }
  socklen_t len = sizeof(sa);
  ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  s->port_ = ntohs(sa.sin_port);
  if (::pipe2(s->wake_pipe_, O_CLOEXEC) != 0) return absl::InternalError("metrics: pipe failed");
  s->thread_ = std::thread(&MetricsHttpServer::Loop, s.get());
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (wake_pipe_[1] >= 0) {
    char c = 0;
    (void)!::write(wake_pipe_[1], &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_pipe_[0], wake_pipe_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void MetricsHttpServer::Loop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (fds[0].revents & POLLIN) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      timeval tv{2, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      Serve(fd);
      ::close(fd);
    }
  }
}

void MetricsHttpServer::Serve(int fd) {
  // Read the request head (up to 8 KiB, until the blank line).
  std::string req;
  char buf[1024];
  while (req.size() < 8192 && req.find("\r\n\r\n") == std::string::npos &&
         req.find("\n\n") == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    req.append(buf, static_cast<size_t>(n));
  }
  auto reply = [&](const char* status, const std::string& type, const std::string& body) {
    WriteAll(fd, absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                              "\r\nContent-Length: ", body.size(),
                              "\r\nConnection: close\r\n\r\n", body));
  };
  size_t eol = req.find_first_of("\r\n");
  std::string line = req.substr(0, eol == std::string::npos ? req.size() : eol);
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) {
    reply("400 Bad Request", "text/plain", "bad request\n");
    return;
  }
  std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (method != "GET" && method != "HEAD") {
    reply("405 Method Not Allowed", "text/plain", "only GET\n");
    return;
  }
  if (path != "/metrics" && path.rfind("/metrics?", 0) != 0) {
    reply("404 Not Found", "text/plain", "try /metrics\n");
    return;
  }
  reply("200 OK", "text/plain; version=0.0.4", registry_->Render());
}

}  // namespace pscluster
