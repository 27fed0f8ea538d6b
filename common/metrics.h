// Prometheus text-format metrics (exposition format 0.0.4) served over plain HTTP at /metrics.
//
// A daemon owns one MetricsRegistry, registers counters and gauges (or callbacks that compute
// values when scraped), and starts a MetricsHttpServer on its --metrics_listen address.
// Counters and gauges are lock-free; Render() and the HTTP server are thread-safe.
#ifndef PSCLUSTER_COMMON_METRICS_H_
#define PSCLUSTER_COMMON_METRICS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pscluster {

class Counter {
 public:
  void Add(double v = 1) {
    double cur = value_.load(std::memory_order_relaxed);
    while (!value_.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
    }
  }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A distribution (Prometheus histogram type): observations counted into buckets by upper bound,
// plus their sum and count. Observe() is lock-free; bucket counts are read one at a time, so a
// scrape racing an observation may see it in the count and not yet in a bucket (Prometheus
// tolerates that).
class Histogram {
 public:
  // `bounds`: increasing upper bounds; +Inf is implied.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  void ObserveSeconds(absl::Duration d) { Observe(absl::ToDoubleSeconds(d)); }

  const std::vector<double>& bounds() const { return bounds_; }
  // Observations <= bounds()[i] (i < bounds().size()), and all of them at i == bounds().size().
  uint64_t cumulative(size_t i) const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1, not cumulative.
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

// Bounds for latencies in seconds: 25 us to 10 s, about 2.5x apart.
std::vector<double> LatencyBuckets();

// One sample of a computed metric: optional labels ("job=\"j1\",shard=\"3\"") and a value.
struct Sample {
  std::string labels;
  double value = 0;
};

class MetricsRegistry {
 public:
  // Names must match [a-zA-Z_:][a-zA-Z0-9_:]*; returned pointers live as long as the registry.
  Counter* AddCounter(const std::string& name, const std::string& help);
  Gauge* AddGauge(const std::string& name, const std::string& help);
  // A gauge family computed at scrape time (e.g. per-shard load).
  void AddGaugeCallback(const std::string& name, const std::string& help,
                        std::function<std::vector<Sample>()> fn);
  // A counter family computed at scrape time (totals a component already keeps).
  void AddCounterCallback(const std::string& name, const std::string& help,
                          std::function<std::vector<Sample>()> fn);

  // A histogram; histograms added under one name with different `labels` ("method=\"Pull\"")
  // form one family. The name gets _bucket, _sum and _count series.
  Histogram* AddHistogram(const std::string& name, const std::string& help,
                          const std::string& labels = "",
                          std::vector<double> bounds = LatencyBuckets());
  std::string Render() const;

 private:
  struct Family {
    std::string name, help, type;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::function<std::vector<Sample>()> fn;
    std::vector<std::pair<std::string, std::unique_ptr<Histogram>>> histograms;  // By labels.
  };
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
};

// A minimal HTTP/1.0 server: GET /metrics returns the registry's text, anything else 404/400.
// One thread accepts and serves connections one at a time, each with a 2 s I/O timeout, so a
// slow or hostile client cannot wedge it for long.
class MetricsHttpServer {
 public:
  // `address` is host:port (port 0 = any free port). REQUIRES: registry outlives the server.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& address,
                                                                  const MetricsRegistry* registry);
  ~MetricsHttpServer();
  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  void Loop();
  void Serve(int fd);

  const MetricsRegistry* registry_ = nullptr;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_METRICS_H_
