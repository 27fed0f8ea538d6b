#include "common/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace pscluster {
namespace {

// Sends `request` to 127.0.0.1:port and returns everything the server answered.
std::string Http(int port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ::send(fd, request.data(), request.size(), 0);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

TEST(MetricsTest, RendersPrometheusText) {
  MetricsRegistry reg;
  Counter* pushes = reg.AddCounter("ps_pushes_total", "Push chunks applied.");
  Gauge* depth = reg.AddGauge("ps_queue_depth", "Requests in flight.");
  reg.AddGaugeCallback("ps_shard_bytes_per_second", "Per-shard load.", [] {
    return std::vector<Sample>{{"job=\"j1\",shard=\"3\"", 1.5}, {"job=\"j1\",shard=\"4\"", 0}};
  });
  pushes->Add(3);
  pushes->Add();
  depth->Set(7);
  std::string text = reg.Render();
  EXPECT_NE(text.find("# TYPE ps_pushes_total counter\nps_pushes_total 4\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("# HELP ps_queue_depth Requests in flight.\n"), std::string::npos);
  EXPECT_NE(text.find("ps_queue_depth 7\n"), std::string::npos);
  EXPECT_NE(text.find("ps_shard_bytes_per_second{job=\"j1\",shard=\"3\"} 1.5\n"), std::string::npos);
}

// Histograms render as Prometheus histograms: cumulative buckets ending in +Inf, _sum and _count,
// one family for every label set added under a name; a value on a bound counts in its bucket.
TEST(MetricsTest, RendersHistogramsCumulatively) {
  MetricsRegistry reg;
  Histogram* pull = reg.AddHistogram("ps_call_seconds", "Call latency.", "method=\"Pull\"",
                                     {0.001, 0.01, 0.1});
  Histogram* push = reg.AddHistogram("ps_call_seconds", "Call latency.", "method=\"Push\"",
                                     {0.001, 0.01, 0.1});
  Histogram* plain = reg.AddHistogram("ps_apply_seconds", "Apply latency.");
  pull->Observe(0.0005);
  pull->Observe(0.001);  // On the bound: le="0.001".
  pull->ObserveSeconds(absl::Milliseconds(50));
  pull->Observe(7);  // Beyond every bound: +Inf only.
  push->Observe(0.02);
  plain->ObserveSeconds(absl::Microseconds(30));
  EXPECT_EQ(pull->count(), 4u);
  EXPECT_NEAR(pull->sum(), 7.0515, 1e-9);
  EXPECT_EQ(pull->cumulative(0), 2u);
  EXPECT_EQ(pull->cumulative(2), 3u);
  EXPECT_EQ(pull->cumulative(3), 4u);
  const std::string text = reg.Render();
  const std::string want =
      "# HELP ps_call_seconds Call latency.\n"
      "# TYPE ps_call_seconds histogram\n"
      "ps_call_seconds_bucket{method=\"Pull\",le=\"0.001\"} 2\n"
      "ps_call_seconds_bucket{method=\"Pull\",le=\"0.01\"} 2\n"
      "ps_call_seconds_bucket{method=\"Pull\",le=\"0.1\"} 3\n"
      "ps_call_seconds_bucket{method=\"Pull\",le=\"+Inf\"} 4\n"
      "ps_call_seconds_sum{method=\"Pull\"} 7.0514999999999999\n"
      "ps_call_seconds_count{method=\"Pull\"} 4\n"
      "ps_call_seconds_bucket{method=\"Push\",le=\"0.001\"} 0\n"
      "ps_call_seconds_bucket{method=\"Push\",le=\"0.01\"} 0\n"
      "ps_call_seconds_bucket{method=\"Push\",le=\"0.1\"} 1\n"
      "ps_call_seconds_bucket{method=\"Push\",le=\"+Inf\"} 1\n";
  EXPECT_NE(text.find(want), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE ps_apply_seconds histogram\n"
                      "ps_apply_seconds_bucket{le=\"2.5e-05\"} 0\n"
                      "ps_apply_seconds_bucket{le=\"5e-05\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ps_apply_seconds_count 1\n"), std::string::npos) << text;
}

TEST(MetricsTest, ServesMetricsOverHttpAndRefusesTheRest) {
  MetricsRegistry reg;
  reg.AddCounter("up_total", "x")->Add(2);
  auto server = MetricsHttpServer::Start("127.0.0.1:0", &reg);
  ASSERT_TRUE(server.ok()) << server.status();
  int port = (*server)->port();
  ASSERT_GT(port, 0);
  std::string ok = Http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.0 200 OK", 0), 0u) << ok;
  EXPECT_NE(ok.find("up_total 2"), std::string::npos);
  EXPECT_EQ(Http(port, "GET /other HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 404", 0), 0u);
  EXPECT_EQ(Http(port, "POST /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 405", 0), 0u);
  EXPECT_EQ(Http(port, "garbage\r\n\r\n").rfind("HTTP/1.0 400", 0), 0u);
  EXPECT_EQ(Http(port, std::string(9000, 'x')).rfind("HTTP/1.0 400", 0), 0u);
  // Still serving after all that.
  EXPECT_NE(Http(port, "GET /metrics HTTP/1.0\r\n\r\n").find("up_total 2"), std::string::npos);
}

TEST(MetricsTest, BadAddressIsNamed) {
  MetricsRegistry reg;
  auto s = MetricsHttpServer::Start("nonsense", &reg);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("--metrics_listen"), std::string::npos);
}

}  // namespace
}  // namespace pscluster
