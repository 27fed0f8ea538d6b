// A small HTTP/1.0 server for read-only pages and JSON (the scheduler's web status page): GET and
// HEAD only, one request per connection (Connection: close), the request head capped at 16 KiB.
//
// Thread model: one thread accepts; `threads` threads serve the accepted connections, each with
// an I/O timeout, so a browser's idle pre-opened connections or a slow client hold up one thread
// for at most that long, never the others. At most 64 connections wait for a thread; more are
// closed at once. The handler runs on the serving threads and must be thread-safe.
#ifndef PSCLUSTER_COMMON_HTTP_SERVER_H_
#define PSCLUSTER_COMMON_HTTP_SERVER_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pscluster {

struct HttpRequest {
  std::string method;  // "GET" or "HEAD".
  std::string path;    // Decoded ("/api/jobs/job-1"), without the query.
  std::string query;   // After '?', as sent ("" = none).
  std::map<std::string, std::string> headers;  // Names in lower case.
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // Extra headers.
};

struct HttpServerOptions {
  std::string address;       // host:port (port 0 = any free port); IPv4 or "localhost".
  std::string flag = "--http_listen";  // Names the setting in errors.
  int threads = 4;
  absl::Duration io_timeout = absl::Seconds(5);
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Listens on options.address. Errors name options.flag: a malformed address, a port in use.
  // REQUIRES: whatever `handler` uses outlives the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           Handler handler);
  // Stops accepting, lets the requests being served finish, and joins the threads.
  ~HttpServer();
  int port() const { return port_; }

  // "OK", "Not Found"... for a status code.
  static const char* Reason(int status);

 private:
  HttpServer() = default;
  void AcceptLoop();
  void ServeLoop();
  void Serve(int fd);

  HttpServerOptions options_;
  Handler handler_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  int port_ = 0;
  std::thread acceptor_;
  std::vector<std::thread> servers_;
  absl::Mutex mu_;
  std::deque<int> pending_ ABSL_GUARDED_BY(mu_);  // Accepted connections, oldest first.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_HTTP_SERVER_H_
