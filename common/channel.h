// Client channels to pscluster daemons, with the message limits and keepalive settings the data
// plane needs. Every call made on them must still set its own deadline (see CallContext()).
#ifndef PSCLUSTER_COMMON_CHANNEL_H_
#define PSCLUSTER_COMMON_CHANNEL_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace pscluster {

struct ChannelOptions {
  TlsFiles tls;
  int max_message_bytes = 64 << 20;
  // Hostname the server certificate is checked against (default: the address's host).
  std::string tls_server_name;
  // Bearer token sent as "authorization: Bearer <token>" on every call made on the channel,
  // unary and streaming (psctl's --token_file, a daemon's --credential_file). Empty = none.
  std::string bearer_token;
  // Extra integer channel arguments (GRPC_ARG_*), e.g. HTTP/2 window and frame sizes.
  std::vector<std::pair<std::string, int>> int_args;
};

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ChannelOptions& options = {});

// A context with a deadline `timeout` from now. (The bearer token is added by the channel.)
std::unique_ptr<grpc::ClientContext> CallContext(absl::Duration timeout,
                                                 const ChannelOptions& options = {});

// Waits until `channel` is connected or `timeout` passes.
bool WaitForConnected(grpc::Channel* channel, absl::Duration timeout);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_CHANNEL_H_
