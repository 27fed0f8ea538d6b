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
