// The exchanges that open a client's data connection (server/tcp_frame.h), before its rounds:
// authentication (kinds 5 and 6) on every connection, then, on a Unix socket, the offer of
// shared memory (kind 4). Both run on the fresh non-blocking socket with a deadline.
#ifndef PSCLUSTER_SERVER_CLIENT_SOCKET_SETUP_H_
#define PSCLUSTER_SERVER_CLIENT_SOCKET_SETUP_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/data_auth.h"
#include "server/shm_ring.h"

namespace pscluster {

// Answers the server's challenge with `auth` (a proof when auth.secret is set) and reads the
// verdict. Errors name `peer`: the server's refusal as it sent it (its code and message);
// UNAUTHENTICATED when the server requires a proof and `auth` has no secret.
absl::Status AuthenticateDataSocket(int fd, const DataAuth& auth, const std::string& peer);

// Offers the server `area` (the frame carries its memfd) and reads the answer: true when it
// attached the memory, false when it refused.
absl::StatusOr<bool> OfferSharedMemory(int fd, const ShmArea& area, const std::string& peer);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_SOCKET_SETUP_H_
