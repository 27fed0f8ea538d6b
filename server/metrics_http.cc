#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pscluster {
namespace {

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

void Metric(std::string* out, const char* name, const char* type, const char* help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void Sample(std::string* out, const char* name, const std::string& labels, double v) {
  absl::StrAppend(out, name, labels.empty() ? "" : "{", labels, labels.empty() ? "" : "}", " ", v,
                  "\n");
}

}  // namespace

std::string RenderMetrics(const v1::ServerStatus& s, uint64_t memory_used, uint64_t memory_limit) {
  std::string o;
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    Metric(&o, name, type, help);
    Sample(&o, name, "", v);
  };
  one("pscluster_server_uptime_seconds", "gauge", "Seconds since the daemon started.", s.uptime_sec());
  one("pscluster_server_push_chunks_total", "counter", "Push chunks applied.", s.pushes_total());
  one("pscluster_server_pulls_total", "counter", "Pull requests served.", s.pulls_total());
  one("pscluster_server_duplicate_pushes_total", "counter",
      "Push chunks acknowledged without being applied again.", s.duplicates_total());
  one("pscluster_server_bytes_in_total", "counter", "Payload bytes received.", s.bytes_in_total());
  one("pscluster_server_bytes_out_total", "counter", "Payload bytes sent.", s.bytes_out_total());
  one("pscluster_server_queue_depth", "gauge", "Requests accepted and not finished.", s.queue_depth());
  one("pscluster_server_memory_used_bytes", "gauge", "Parameter and optimizer bytes held.",
      static_cast<double>(memory_used));
  one("pscluster_server_memory_limit_bytes", "gauge", "--memory_bytes (0 = unlimited).",
      static_cast<double>(memory_limit));
  Metric(&o, "pscluster_server_phase_seconds_total", "counter",
         "Data-plane time by phase, summed over threads.");
  const auto& t = s.times();
  for (const auto& [phase, v] : std::vector<std::pair<const char*, double>>{
           {"parse", t.parse_sec()}, {"queue", t.queue_sec()}, {"apply", t.apply_sec()},
           {"read", t.read_sec()}, {"park", t.park_sec()}}) {
    Sample(&o, "pscluster_server_phase_seconds_total", absl::StrCat("phase=\"", phase, "\""), v);
  }
  Metric(&o, "pscluster_job_min_clock", "gauge", "Slowest worker's clock.");
  for (const auto& j : s.jobs()) {
    Sample(&o, "pscluster_job_min_clock", absl::StrCat("job=\"", Escape(j.job_id()), "\""), j.min_clock());
  }
  Metric(&o, "pscluster_job_worker_clock", "gauge", "Steps each worker completed on this server.");
  for (const auto& j : s.jobs()) {
    for (const auto& c : j.clocks()) {
      Sample(&o, "pscluster_job_worker_clock",
             absl::StrCat("job=\"", Escape(j.job_id()), "\",worker=\"", c.worker(), "\""), c.clock());
    }
  }
  Metric(&o, "pscluster_job_waiting_pulls", "gauge", "Pulls parked for BSP/SSP.");
  for (const auto& j : s.jobs()) {
    Sample(&o, "pscluster_job_waiting_pulls", absl::StrCat("job=\"", Escape(j.job_id()), "\""),
           j.waiting_pulls());
  }
  Metric(&o, "pscluster_job_mean_staleness", "gauge", "Mean reader clock minus min clock.");
  for (const auto& j : s.jobs()) {
    Sample(&o, "pscluster_job_mean_staleness", absl::StrCat("job=\"", Escape(j.job_id()), "\""),
           j.mean_staleness());
  }
  Metric(&o, "pscluster_job_checkpoint_age_seconds", "gauge",
         "Seconds since the last checkpoint (-1 = none).");
  for (const auto& j : s.jobs()) {
    Sample(&o, "pscluster_job_checkpoint_age_seconds",
           absl::StrCat("job=\"", Escape(j.job_id()), "\""), j.checkpoint_age_sec());
  }
  Metric(&o, "pscluster_table_bytes", "gauge", "Parameter and optimizer bytes of a table held here.");
  for (const auto& j : s.jobs()) {
    for (const auto& tb : j.tables()) {
      Sample(&o, "pscluster_table_bytes",
             absl::StrCat("job=\"", Escape(j.job_id()), "\",table=\"", Escape(tb.name()), "\""),
             static_cast<double>(tb.bytes()));
    }
  }
  return o;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, std::function<std::string()> render) {
  size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics_listen: '", listen,
                                                   "' must be host:port"));
  }
  std::string host = listen.substr(0, colon);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints,
                  &res) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics_listen: cannot resolve '", host, "'"));
  }
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(s->fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  bool ok = s->fd_ >= 0 && bind(s->fd_, res->ai_addr, res->ai_addrlen) == 0 && ::listen(s->fd_, 16) == 0;
  freeaddrinfo(res);
  if (!ok) {
    return absl::UnavailableError(absl::StrCat("--metrics_listen: cannot listen on ", listen, ": ",
                                               static_cast<const char*>(strerror(errno))));
  }
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  getsockname(s->fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  std::string shown = host.empty() || host == "0.0.0.0" ? "127.0.0.1" : host;
  s->address_ = absl::StrCat(shown, ":", ntohs(bound.sin_port));
  s->render_ = std::move(render);
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
}

void MetricsHttpServer::Loop() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    timeval tv{2, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string req;
    char buf[2048];
    while (req.find("\r\n\r\n") == std::string::npos && req.size() < 8192) {
      ssize_t n = read(c, buf, sizeof(buf));
      if (n <= 0) break;
      req.append(buf, n);
    }
    std::string body, status = "200 OK";
    if (absl::StartsWith(req, "GET /metrics ") || absl::StartsWith(req, "GET /metrics?")) {
      body = render_();
    } else {
      status = "404 Not Found";
      body = "only GET /metrics is served here\n";
    }
    std::string resp = absl::StrCat("HTTP/1.0 ", status,
                                    "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: ",
                                    body.size(), "\r\nConnection: close\r\n\r\n", body);
    for (size_t off = 0; off < resp.size();) {
      ssize_t n = write(c, resp.data() + off, resp.size() - off);
      if (n <= 0) break;
      off += n;
    }
    close(c);
  }
}

}  // namespace pscluster
