// TLS material for gRPC servers and channels, read from PEM files named by flags.
//
// Server: cert + key enable TLS; adding a CA also requires and verifies client certificates
// (mutual TLS, used between daemons). Client: a CA verifies the server; cert + key present a
// client certificate. All empty = plaintext (loopback and trusted networks only).
#ifndef PSCLUSTER_COMMON_TLS_H_
#define PSCLUSTER_COMMON_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace pscluster {

struct TlsFiles {
  std::string cert;  // PEM certificate chain of this side.
  std::string key;   // PEM private key of this side.
  std::string ca;    // PEM CA bundle that verifies the peer.

  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// Errors name the file that could not be read or the flag that is missing.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& tls);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const TlsFiles& tls);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_TLS_H_
