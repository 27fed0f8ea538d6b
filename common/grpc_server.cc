#include "common/grpc_server.h"

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"

namespace pscluster {
namespace {

// "0.0.0.0:0" -> ("0.0.0.0", "0"); "[::]:0" -> ("[::]", "0").
std::pair<std::string, std::string> SplitHostPort(const std::string& addr) {
  size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return {addr, ""};
  return {addr.substr(0, colon), addr.substr(colon + 1)};
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const GrpcServerOptions& options, const std::vector<grpc::Service*>& services) {
  auto [host, port_str] = SplitHostPort(options.listen_address);
  if (host.empty() || port_str.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address '", options.listen_address, "' must be host:port (port 0 = any free port)"));
  }
  auto creds = MakeServerCredentials(options.tls);
  if (!creds.ok()) return creds.status();

  // Both are process-wide switches in gRPC; they only take effect for servers built afterwards.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::unique_ptr<GrpcServer> out(new GrpcServer());
  grpc::ServerBuilder builder;
  int selected_port = 0;
  builder.AddListeningPort(options.listen_address, *creds, &selected_port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // gRPC sets SO_REUSEPORT by default, which lets a second daemon silently share a port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Our channels ping every 10 s while connected, with or without calls (common/channel.cc).
  // gRPC's server defaults allow one ping per 5 minutes without data (per 2 hours without calls)
  // and drop the connection with GOAWAY "too_many_pings" at the third early one, failing every
  // call on it: a pull parked for a slow worker, a silent stream, lost after about 30 s.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  for (const auto& [name, value] : options.int_args) builder.AddChannelArgument(name, value);
  for (grpc::Service* s : services) builder.RegisterService(s);
  out->server_ = builder.BuildAndStart();
  if (out->server_ == nullptr || selected_port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address,
                     " (address in use, not local, or not permitted)"));
  }
  out->port_ = selected_port;
  std::string client_host = host;
  if (host == "0.0.0.0" || host == "[::]" || host == "::" || host == "[::0]") {
    client_host = "127.0.0.1";
  }
  out->address_ = absl::StrCat(client_host, ":", selected_port);
  out->SetServing(true);
  Logger(options.component)->info("listening on {} (requested {}{})", out->address_,
                                  options.listen_address, options.tls.enabled() ? ", TLS" : "");
  if (!options.port_file.empty()) {
    absl::Status s = WriteFileAtomically(options.port_file, absl::StrCat(out->address_, "\n"));
    if (!s.ok()) {
      out->Shutdown(absl::ZeroDuration());
      return absl::Status(s.code(), absl::StrCat("--port_file: ", s.message()));
    }
  }
  return out;
}

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

void GrpcServer::SetServing(bool serving) {
  if (server_ == nullptr) return;
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(serving);
}

void GrpcServer::Shutdown(absl::Duration grace) {
  if (server_ == nullptr || shut_down_) return;
  shut_down_ = true;
  SetServing(false);
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
  server_->Wait();
}

void GrpcServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace pscluster
