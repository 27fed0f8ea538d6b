#include "server/client/dialer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_convert.h"
#include "server/tcp_frame.h"

namespace pscluster {

absl::StatusOr<DataTransport> ParseDataTransport(absl::string_view name) {
  if (name == "auto") return DataTransport::kAuto;
  if (name == "grpc") return DataTransport::kGrpc;
  if (name == "tcp") return DataTransport::kTcp;
  if (name == "unix") return DataTransport::kUnix;
  return absl::InvalidArgumentError(
      absl::StrCat("data transport '", name, "' must be auto, grpc, tcp or unix"));
}

absl::StatusOr<Dialed> DialDataConn(v1::ParameterServer::Stub* stub, const std::string& address,
                                    const DialOptions& o) {
  Dialed none;
  if (o.transport == DataTransport::kGrpc) {
    none.why_none = absl::UnavailableError("the data transport is grpc");
    return none;
  }
  if (!o.channel.bearer_token.empty() && o.auth.secret.empty()) {
    none.why_none = absl::UnavailableError(absl::StrCat(
        "a credential is set and there is no job data secret to prove on the data sockets of ",
        address));
    return none;
  }
  v1::ServerStatusRequest req;
  req.set_brief(true);
  v1::ServerStatus resp;
  auto ctx = CallContext(o.timeout, o.channel);
  absl::Status st = FromGrpcStatus(stub->Status(ctx.get(), req, &resp),
                                   absl::StrCat("Status of ", address));
  if (!st.ok()) return st;
  std::string host, port;
  st = SplitHostPort(address, &host, &port);
  if (!st.ok()) return st;
  if (o.transport == DataTransport::kAuto || o.transport == DataTransport::kUnix) {
    absl::Status unix_st;
    if (resp.data_unix().empty()) {
      unix_st = absl::UnavailableError(absl::StrCat(address, " offers no Unix data socket"));
    } else if (!IsLocalHost(host)) {
      unix_st = absl::UnavailableError(
          absl::StrCat(address, " is not on this host: no Unix data socket"));
    } else {
      auto c = TcpConn::OpenUnix(resp.data_unix(), resp.pid(), address, o.pool, o.spin,
                                 o.shm_ring_bytes, o.auth);
      if (c.ok()) return Dialed{std::move(*c), absl::OkStatus()};
      unix_st = c.status();
    }
    if (o.transport == DataTransport::kUnix) return unix_st;
    Logger("worker")->debug("data plane to {}: {}; trying TCP", address, unix_st);
  }
  if (resp.data_port() == 0) {
    none.why_none = absl::UnavailableError(absl::StrCat(address, " offers no TCP data port"));
    return none;
  }
  std::shared_ptr<TlsContext> tls;
  if (o.channel.tls.enabled()) {
    // The data port speaks TLS with the channel's certificates.
    auto t = TlsContext::ForClient(o.channel.tls, o.channel.tls_server_name);
    if (!t.ok()) {
      return absl::Status(t.status().code(),
                          absl::StrCat("data port of ", address, ": ", t.status().message()));
    }
    tls = std::move(*t);
  }
  auto c = TcpConn::Open(host, static_cast<int>(resp.data_port()), address, o.timeout, o.pool,
                         o.spin, o.auth, tls.get());
  if (!c.ok()) return c.status();
  return Dialed{std::move(*c), absl::OkStatus()};
}

}  // namespace pscluster
