// Starts a gRPC server the way every pscluster daemon does: binds the requested address (port 0
// lets the OS choose and the real port is reported), serves standard health checking
// (grpc.health.v1) and server reflection beside the daemon's own services.
//
// Thread model: Start() and Shutdown() are called by the owner; port()/address() are immutable
// after Start(); SetServing() is thread-safe.
#ifndef PSCLUSTER_COMMON_GRPC_SERVER_H_
#define PSCLUSTER_COMMON_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "grpcpp/server.h"

namespace pscluster {

struct GrpcServerOptions {
  // host:port to listen on; port 0 = any free port (reported by port() and in the log).
  std::string listen_address = "127.0.0.1:0";
  TlsFiles tls;
  // Largest message accepted or sent. Data-plane chunks stay far below (about 4 MiB).
  int max_message_bytes = 64 << 20;
  // If non-empty, "host:port\n" is written here (crash-safe) once the server listens, so a
  // launcher or test can find a daemon that bound port 0.
  std::string port_file;
  // Name used in log lines ("server", "scheduler", ...).
  std::string component = "grpc";
  // Extra integer channel arguments (GRPC_ARG_*), e.g. HTTP/2 window and frame sizes tuned for
  // a daemon's traffic.
  std::vector<std::pair<std::string, int>> int_args;
};

class GrpcServer {
 public:
  // REQUIRES: every service outlives the returned server.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options,
                                                           const std::vector<grpc::Service*>& services);
  ~GrpcServer();

  int port() const { return port_; }
  // "host:port" with the real port, usable by clients (0.0.0.0 and [::] become 127.0.0.1).
  const std::string& address() const { return address_; }

  // Overall health as reported to grpc.health.v1 (SERVING after Start()).
  void SetServing(bool serving);

  // Stops accepting calls, gives in-flight calls `grace` to finish, then cancels them.
  void Shutdown(absl::Duration grace = absl::Seconds(2));
  // Blocks until Shutdown() completes.
  void Wait();

  grpc::Server* server() { return server_.get(); }

 private:
  GrpcServer() = default;

  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  bool shut_down_ = false;
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_GRPC_SERVER_H_
