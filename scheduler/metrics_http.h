// A minimal HTTP/1.0 endpoint serving Prometheus text metrics at GET /metrics (anything else is
// 404). One thread, one request per connection, bounded reads with a timeout: enough for a
// scraper, nothing a hostile client can hold open.
#ifndef PSCLUSTER_SCHEDULER_METRICS_HTTP_H_
#define PSCLUSTER_SCHEDULER_METRICS_HTTP_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace pscluster::scheduler {

class MetricsHttpServer {
 public:
  // Listens on `address` (host:port, port 0 = any); `render` produces the page on each scrape.
  // REQUIRES: `render` is thread-safe and outlives the server.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, std::function<std::string()> render);
  ~MetricsHttpServer();

  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  void Serve();
  void Handle(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::function<std::string()> render_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_METRICS_HTTP_H_
