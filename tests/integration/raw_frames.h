// Raw access to a ps_server's TCP data port for tests: connect, write bytes and frame headers
// as they are, read the server's frames back.
#ifndef PSCLUSTER_TESTS_INTEGRATION_RAW_FRAMES_H_
#define PSCLUSTER_TESTS_INTEGRATION_RAW_FRAMES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace pscluster::testing {

// A TCP connection to 127.0.0.1:`port` with a 10 s receive timeout (-1 after a test failure),
// past the authentication exchange (unauthenticated: no proof).
int Connect(int port);

// A connection to the abstract Unix socket `name` with a 10 s receive timeout (-1 after a test
// failure), past the authentication exchange (unauthenticated: no proof).
int ConnectUnix(const std::string& name);

// The same before the authentication exchange: the server's challenge is waiting to be read.
int ConnectRaw(int port);
int ConnectUnixRaw(const std::string& name);

// Reads the server's challenge (server/tcp_frame.h, kind 5): its nonce, and in `*required`
// whether the server requires a proof. Empty after a test failure.
std::string ReadChallenge(int fd, bool* required = nullptr);

// Sends an auth frame claiming `job`, `worker`, `attempt` with `proof` and reads the answer: OK
// when the server accepted it, else the status it closed the connection with.
absl::Status SendAuth(int fd, const std::string& job, uint32_t worker, uint32_t attempt,
                      const std::string& proof);

// Sends `frame` as it is (any bytes, meant as an auth frame), then, with `end_writes`, shuts the
// connection's writing side (the server sees the end of what it will get), and reads the answer
// as SendAuth does.
absl::Status SendAuthBytes(int fd, const std::string& frame, bool end_writes);

// Sends an attach frame (server/tcp_frame.h, kind 4) announcing rings of `request` and `reply`
// bytes, with `memfd` passed along (none when -1); a test failure if the socket does not take it.
void SendAttach(int fd, int memfd, uint64_t request, uint64_t reply);

// Writes all of `bytes`; a test failure if the socket does not take them.
void SendRaw(int fd, const std::string& bytes);

// A frame header with exactly these fields (server/tcp_frame.h).
std::string Header(uint32_t magic, uint32_t kind, uint32_t length, uint32_t aux);

// Reads frames until the server's status frame or the end of the connection. Returns the
// status (UNAVAILABLE "closed" when the server only closed, or nothing came for 10 s).
absl::Status ReadUntilStatus(int fd);

}  // namespace pscluster::testing

#endif  // PSCLUSTER_TESTS_INTEGRATION_RAW_FRAMES_H_
