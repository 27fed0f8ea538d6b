#include "common/tls.h"

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"

namespace pscluster {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag) {
  auto data = ReadFile(path);
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrCat(flag, ": cannot read ", path, ": ", data.status().message()));
  }
  if (data->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is not a PEM file"));
  }
  return data;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  grpc::SslServerCredentialsOptions opts(
      tls.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                     : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  auto cert = ReadPem(tls.cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(tls.key, "--tls_key");
  if (!key.ok()) return key.status();
  opts.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.ca.empty()) {
    auto ca = ReadPem(tls.ca, "--tls_ca");
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *ca;
  }
  return grpc::SslServerCredentials(opts);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions opts;
  if (!tls.ca.empty()) {
    auto ca = ReadPem(tls.ca, "--tls_ca");
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *ca;
  }
  if (!tls.cert.empty() || !tls.key.empty()) {
    if (tls.cert.empty() || tls.key.empty()) {
      return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
    }
    auto cert = ReadPem(tls.cert, "--tls_cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(tls.key, "--tls_key");
    if (!key.ok()) return key.status();
    opts.pem_cert_chain = *cert;
    opts.pem_private_key = *key;
  }
  return grpc::SslCredentials(opts);
}

}  // namespace pscluster
