// The one place that chooses how data-plane rounds reach a server: asks the server's Status for
// its data sockets, then connects to its Unix socket (same host; shared memory when asked), else
// its TCP data port, as the allowed transport says, else reports that none can be used (the
// caller then speaks gRPC). Used by PsClient (workers, benchmarks) and by servers' copies to
// their backups.
#ifndef PSCLUSTER_SERVER_CLIENT_DIALER_H_
#define PSCLUSTER_SERVER_CLIENT_DIALER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "proto/ps.grpc.pb.h"
#include "server/buffer_pool.h"
#include "server/client/tcp_conn.h"

namespace pscluster {

// How data-plane rounds travel to a server.
enum class DataTransport {
  // The server's Unix data socket when the server is on this host (its address is a local one,
  // the socket is reachable and served by the server's process), else its TCP data port when it
  // offers one (in TLS when the channel has TLS); else gRPC PushPull.
  kAuto,
  kGrpc,  // Always the gRPC PushPull stream.
  kTcp,   // Always the TCP data port, even on the same host (calls fail when a server offers none).
  kUnix,  // Always the Unix data socket (calls fail unless the server is on this host).
};

// "auto", "grpc", "tcp", "unix"; anything else is INVALID_ARGUMENT naming the value.
absl::StatusOr<DataTransport> ParseDataTransport(absl::string_view name);

struct DialOptions {
  DataTransport transport = DataTransport::kAuto;
  absl::Duration timeout = absl::Seconds(10);  // For the Status call and for the connect.
  // Its TLS files (and server name) also secure the TCP data port; a credential without a job
  // data secret: the sockets are not used.
  ChannelOptions channel;
  std::shared_ptr<BufferPool> pool;            // Receive buffers of the connection.
  absl::Duration spin;                         // See TcpConn::Open.
  size_t shm_ring_bytes = 0;                   // Unix socket only: 0 = no shared memory.
  // What the connection proves (common/data_auth.h). Without a secret it goes unauthenticated,
  // which servers that authenticate their callers refuse.
  DataAuth auth;
};

// What a dial found: a connection, or none that `options` allow, with why.
struct Dialed {
  std::shared_ptr<TcpConn> conn;  // Null: use gRPC (see why_none).
  absl::Status why_none;          // UNAVAILABLE naming the server and what it lacks.
};

// Dials `address` (whose Status `stub` answers). An error: its Status could not be asked, or a
// socket it offers could not be connected (for kUnix, also a Unix socket that cannot be used).
// With TLS the TCP port is dialed in TLS (the channel's certificates; a failed handshake is an
// error naming the server and why). With a bearer credential but no job data secret (the
// credential cannot be checked on the sockets; the secret can), with kGrpc, and when the
// server offers no socket the transport allows: Dialed with no connection.
absl::StatusOr<Dialed> DialDataConn(v1::ParameterServer::Stub* stub, const std::string& address,
                                    const DialOptions& options);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_DIALER_H_
