// Socket calls of the data server's connections: a frame header read together with a file
// descriptor passed over a Unix socket (the shared-memory rings), and the peer's name for logs.
#ifndef PSCLUSTER_SERVER_DATA_SOCKET_IO_H_
#define PSCLUSTER_SERVER_DATA_SOCKET_IO_H_

#include <string>

#include "absl/status/status.h"

namespace pscluster {

// Reads a frame header (blocking) with recvmsg(), taking a file descriptor passed with it
// (`*passed`, -1 when none). Only the first frame of a Unix connection may carry one.
// OUT_OF_RANGE at the end of the stream before a header; UNAVAILABLE inside one.
absl::Status ReadHeaderWithFd(int fd, unsigned char* header, int* passed);

// "HOST:PORT" of a TCP peer, or "unix peer pid N" of a Unix one (for logs).
std::string PeerName(int fd);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_DATA_SOCKET_IO_H_
