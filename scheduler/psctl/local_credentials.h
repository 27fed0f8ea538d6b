// The credentials of a secured local cluster (`psctl up --local` without --insecure): a random
// bearer token and a TLS certificate per identity, written under WORK_DIR/credentials (mode
// 0700, files 0600), and one token file holding the tokens' hashes that every daemon checks
// callers against:
//
//   admin.token      psctl (roles admin, viewer): `up` itself, and later commands
//   scheduler.token  the scheduler's calls to servers and workers (scheduler)
//   server.token     the servers' calls to the scheduler and to each other (server, node)
//   worker.token     the workers' calls to the scheduler and the servers (worker, node)
//   tokens           SHA-256 of each, with identity and roles (common/token_file.h)
//   ca.pem           a throw-away CA (P-256) whose key is never written: it signs the four
//                    certificates below and nothing else, ever
//   NAME.crt/.key    the certificate (common name: the identity, SANs 127.0.0.1 and
//                    localhost) and key of each identity above: every daemon serves mutual TLS
//                    (--tls_cert/--tls_key, client certificates required with --tls_ca), so
//                    every connection, the TCP data plane's included, is encrypted
//
// New tokens and certificates each time a cluster starts; nothing else on the machine knows
// them.
#ifndef PSCLUSTER_SCHEDULER_PSCTL_LOCAL_CREDENTIALS_H_
#define PSCLUSTER_SCHEDULER_PSCTL_LOCAL_CREDENTIALS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tls.h"

namespace pscluster::psctl {

struct LocalCredentials {
  std::string dir;               // WORK_DIR/credentials
  std::string token_file;        // The hashes: every daemon's --token_file.
  std::string admin_token_file;  // psctl's --token_file.
  std::string admin_token;
  std::string tls_ca;     // The CA every daemon and psctl verify peers with.
  TlsFiles admin_tls;     // psctl's certificate, key and CA.
  // The flags each kind of daemon needs (--token_file, --credential_file, --tls_*).
  std::vector<std::string> scheduler_args;
  std::vector<std::string> server_args;
  std::vector<std::string> worker_args;
};

// Makes fresh tokens in `work_dir`/credentials, replacing those of an earlier cluster there.
// `extra_admin_token` (non-empty: the token psctl was given with --token_file) is admitted too,
// as identity "psctl-user" with roles admin and viewer. Errors name the file.
absl::StatusOr<LocalCredentials> MakeLocalCredentials(const std::string& work_dir,
                                                      const std::string& extra_admin_token);

// Where MakeLocalCredentials puts psctl's token for a cluster in `work_dir`.
std::string LocalAdminTokenFile(const std::string& work_dir);

}  // namespace pscluster::psctl

#endif  // PSCLUSTER_SCHEDULER_PSCTL_LOCAL_CREDENTIALS_H_
