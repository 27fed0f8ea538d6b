// A Prometheus text endpoint: GET /metrics over plain HTTP/1.0 on its own port, rendered from
// the server's Status. One thread accepts and answers requests one at a time.
#ifndef PSCLUSTER_SERVER_METRICS_HTTP_H_
#define PSCLUSTER_SERVER_METRICS_HTTP_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "proto/ps.pb.h"

namespace pscluster {

// Prometheus text exposition (version 0.0.4) of a server status.
std::string RenderMetrics(const v1::ServerStatus& status, uint64_t memory_used,
                          uint64_t memory_limit);

class MetricsHttpServer {
 public:
  // Listens on `listen` (host:port, port 0 = any) and serves `render()` at /metrics.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, std::function<std::string()> render);
  ~MetricsHttpServer();

  const std::string& address() const { return address_; }

 private:
  MetricsHttpServer() = default;
  void Loop();

  int fd_ = -1;
  std::string address_;
  std::function<std::string()> render_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_METRICS_HTTP_H_
