// The exchanges that open a client's data connection (server/tcp_frame.h), before its rounds:
// authentication (kinds 5 and 6) on every connection, then, on a Unix socket, the offer of
// shared memory (kind 4). Both run on the fresh non-blocking socket with a deadline, over TLS
// when the server's TCP port speaks it (server/tls_stream.h).
#ifndef PSCLUSTER_SERVER_CLIENT_SOCKET_SETUP_H_
#define PSCLUSTER_SERVER_CLIENT_SOCKET_SETUP_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/data_auth.h"
#include "server/data_io.h"
#include "server/shm_ring.h"
#include "server/tls_stream.h"

namespace pscluster {

// Answers the server's challenge with `auth` (a proof when auth.secret is set) and reads the
// verdict. Errors name `peer`: the server's refusal as it sent it (its code and message);
// UNAUTHENTICATED when the server requires a proof and `auth` has no secret.
absl::Status AuthenticateDataSocket(DataIo& io, const DataAuth& auth, const std::string& peer);

// Offers the server `area` (the frame carries its memfd) and reads the answer: true when it
// attached the memory, false when it refused.
absl::StatusOr<bool> OfferSharedMemory(int fd, const ShmArea& area, const std::string& peer);

// Connects to host:port within `timeout`; returns the non-blocking socket or an error naming the
// address.
absl::StatusOr<int> ConnectTcp(const std::string& host, int port, absl::Duration timeout);

// Whether `host` (a name or a numeric address) is this machine: a loopback address or one of its
// interfaces' addresses. Only then may a server's Unix socket be tried.
bool IsLocalHost(const std::string& host);

// A connected TCP socket's byte stream: with `tls`, the TLS handshake first (within `timeout`;
// the server's certificate checked against `host` or the context's server name), then the
// authentication. Errors name `peer` and the reason (a failed certificate check, a server that
// does not speak TLS, the server's refusal). The socket stays the caller's.
absl::StatusOr<std::unique_ptr<DataIo>> SetUpDataSocket(int fd, const std::string& host,
                                                        const TlsContext* tls,
                                                        absl::Duration timeout,
                                                        const DataAuth& auth,
                                                        const std::string& peer);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_SOCKET_SETUP_H_
