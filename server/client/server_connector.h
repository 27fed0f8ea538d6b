// How the parameter client reaches each server of a shard map: the gRPC channel of its control
// calls (and of the gRPC PushPull stream), and the data connection its rounds travel on.
// Without one, PsClient dials the network (common/channel.h, dialer.h); tests give it one that
// connects to servers in the same process and injects faults, so that its routing and retries
// run without sockets (server/client/testing/in_process_servers.h).
#ifndef PSCLUSTER_SERVER_CLIENT_SERVER_CONNECTOR_H_
#define PSCLUSTER_SERVER_CLIENT_SERVER_CONNECTOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "server/client/data_conn.h"

namespace pscluster {

class ServerConnector {
 public:
  virtual ~ServerConnector() = default;
  // The channel to the server at `address` (a shard map's ServerInfo.address). An error names
  // what is wrong with the address; the map is then refused.
  virtual absl::StatusOr<std::shared_ptr<grpc::Channel>> Channel(const std::string& address) = 0;
  // A data connection to `address`, or null to use the gRPC PushPull stream on its channel. An
  // error fails the rounds sent to that server (UNAVAILABLE ones are retried with a new
  // connection). Thread-safe: called whenever a connection needs replacing.
  virtual absl::StatusOr<std::shared_ptr<DataConn>> OpenData(const std::string& address) = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_SERVER_CONNECTOR_H_
