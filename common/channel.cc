#include "common/channel.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace pscluster {

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ChannelOptions& options) {
  if (address.empty() || address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "' must be host:port"));
  }
  auto creds = MakeChannelCredentials(options.tls);
  if (!creds.ok()) return creds.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly after a daemon restarts (the default backoff grows to minutes).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  for (const auto& [name, value] : options.int_args) args.SetInt(name, value);
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(address, *creds, args);
}

std::unique_ptr<grpc::ClientContext> CallContext(absl::Duration timeout,
                                                 const ChannelOptions& options) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  if (!options.bearer_token.empty()) {
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", options.bearer_token));
  }
  return ctx;
}

bool WaitForConnected(grpc::Channel* channel, absl::Duration timeout) {
  return channel->WaitForConnected(std::chrono::system_clock::now() +
                                   absl::ToChronoMilliseconds(timeout));
}

}  // namespace pscluster
