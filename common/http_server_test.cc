#include "common/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  return fd;
}

std::string Exchange(int port, const std::string& request) {
  int fd = Connect(port);
  EXPECT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

std::unique_ptr<HttpServer> Echo() {
  HttpServerOptions o;
  o.address = "127.0.0.1:0";
  o.threads = 2;
  auto s = HttpServer::Start(o, [](const HttpRequest& r) {
    HttpResponse resp;
    if (r.path == "/missing") {
      resp.status = 404;
      resp.body = "no";
      return resp;
    }
    resp.body = absl::StrCat(r.method, " ", r.path, " q=", r.query, " auth=",
                             r.headers.count("authorization") ? r.headers.at("authorization") : "-");
    resp.headers.push_back({"Cache-Control", "no-store"});
    return resp;
  });
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

TEST(HttpServerTest, ServesPathQueryAndHeaders) {
  auto s = Echo();
  std::string r = Exchange(s->port(),
                           "GET /api/jobs/job%2D1?x=1 HTTP/1.1\r\nAuthorization: Bearer t\r\n\r\n");
  EXPECT_THAT(r, StartsWith("HTTP/1.0 200 OK\r\n"));
  EXPECT_THAT(r, HasSubstr("Cache-Control: no-store\r\n"));
  EXPECT_THAT(r, HasSubstr("\r\n\r\nGET /api/jobs/job-1 q=x=1 auth=Bearer t"));
  EXPECT_THAT(Exchange(s->port(), "GET /missing HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.0 404"));
  // HEAD: the head only.
  r = Exchange(s->port(), "HEAD / HTTP/1.0\r\n\r\n");
  EXPECT_THAT(r, StartsWith("HTTP/1.0 200"));
  EXPECT_THAT(r, ::testing::EndsWith("\r\n\r\n"));
}

TEST(HttpServerTest, RefusesWritesAndGarbage) {
  auto s = Echo();
  EXPECT_THAT(Exchange(s->port(), "POST / HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.0 405"));
  EXPECT_THAT(Exchange(s->port(), "hello\r\n\r\n"), StartsWith("HTTP/1.0 400"));
  EXPECT_THAT(Exchange(s->port(), "GET /%zz HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.0 400"));
  EXPECT_THAT(Exchange(s->port(), "GET /%00 HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.0 400"));
  EXPECT_THAT(Exchange(s->port(), "GET / HTTP/1.0\r\nnocolon\r\n\r\n"),
              StartsWith("HTTP/1.0 400"));
  EXPECT_THAT(Exchange(s->port(), "GET / HTTP/1.0\r\nX: " + std::string(20000, 'a')),
              StartsWith("HTTP/1.0 431"));
}

// A browser's pre-opened, idle connection does not hold up the next request.
TEST(HttpServerTest, IdleConnectionsDoNotBlockOthers) {
  auto s = Echo();
  int idle = Connect(s->port());
  absl::Time start = absl::Now();
  EXPECT_THAT(Exchange(s->port(), "GET / HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.0 200"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ::close(idle);
}

TEST(HttpServerTest, BadAddressesNameTheFlag) {
  HttpServerOptions o;
  o.address = "nonsense";
  auto s = HttpServer::Start(o, [](const HttpRequest&) { return HttpResponse(); });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("--http_listen: 'nonsense'"));
  o.address = "example.com:80";
  s = HttpServer::Start(o, [](const HttpRequest&) { return HttpResponse(); });
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("not an IPv4 address"));
}

}  // namespace
}  // namespace pscluster
