// The TCP data plane of ps_server: the PushPull stream of the gRPC service, carried on raw TCP
// connections (framing in server/tcp_frame.h), in TLS when the server runs with TLS
// (server/tls_stream.h; the Unix socket, which never leaves the host, stays without). Each connection is served by the same DataStream as a gRPC PushPull call, so the
// semantics (chunk order, exactly-once tags, consistency waits, epochs, errors) are identical;
// only the transport differs: no HTTP/2 framing or flow-control windows, no thread hand-off for
// small messages, and the client can receive values straight into the caller's tensor.
//
// Thread model: one accept thread; per connection a reader thread (reads a frame only when the
// DataStream asks for one, and calls its reactions) and a writer thread that finishes writes the
// socket could not take at once. Writes are attempted inline (non-blocking) on the producing
// thread first. Applies and reads run on the shared data executor, as for gRPC calls.
#ifndef PSCLUSTER_SERVER_TCP_DATA_SERVER_H_
#define PSCLUSTER_SERVER_TCP_DATA_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/executor.h"
#include "server/buffer_pool.h"
#include "server/data_stream.h"
#include "server/ps_handler.h"
#include "server/tls_stream.h"

namespace pscluster {

struct TcpDataServerOptions {
  std::string host = "127.0.0.1";  // Interface to bind (the gRPC --listen host).
  int port = 0;                     // 0: chosen by the OS.
  int max_connections = 256;        // Further connections are closed at once.
  // A write the peer does not take within this time fails the connection.
  absl::Duration send_timeout = absl::Seconds(120);
  // Largest accepted frame (above the server's chunk limit).
  uint32_t max_frame_bytes = 80u << 20;
  // A connection's reader checks an empty socket for this long before it sleeps (the next
  // chunk of a round is usually microseconds away).
  absl::Duration spin = absl::Microseconds(50);
  // Also listen on this abstract Unix socket (clients on the same host; empty = none). A name
  // already taken is logged and skipped: the TCP port still serves.
  std::string unix_name;
  // Largest shared memory a Unix connection may attach (both rings and the control page; 0:
  // none, payloads then go over the socket).
  size_t shm_max_bytes = 256u << 20;
  // Every connection must prove a job's data secret (server/tcp_frame.h, kind 6): the server
  // authenticates its callers (--token_file). Otherwise a connection may also go without a
  // proof and then carries only the messages of jobs that have no data secret.
  bool require_auth = false;
  // A connection must authenticate (and, under TLS, finish its handshake first) within this
  // time (--data_auth_timeout), or it is logged and closed: a peer that connects and stays
  // silent holds a connection slot and two threads only this long.
  absl::Duration auth_timeout = absl::Seconds(30);
  // TLS on the TCP port (the server's certificate, and its CA to require client certificates);
  // nullptr: plaintext. A connection whose handshake fails is logged and closed.
  std::shared_ptr<TlsContext> tls;
};

class TcpDataServer {
 public:
  static absl::StatusOr<std::unique_ptr<TcpDataServer>> Start(
      const TcpDataServerOptions& options, PsHandler* handler, Executor* executor,
      std::shared_ptr<BufferPool> pool, const DataPlaneOptions& data_plane);
  ~TcpDataServer();

  int port() const { return port_; }
  // The abstract Unix socket name listened on (empty: none).
  const std::string& unix_name() const { return unix_name_; }
  // Open connections: all, and those that came through the Unix socket.
  int connections() const;
  int unix_connections() const;
  // Open connections whose payloads go through shared memory, and the payload bytes that went
  // through it (received, sent) since the start.
  int shm_connections() const;
  // Open connections by how their payloads travel.
  struct ConnectionCounts {
    int tcp = 0;
    int unix_socket = 0;  // Without shared memory.
    int shm = 0;
  };
  ConnectionCounts CountConnections() const;
  uint64_t shm_bytes_received() const { return shm_counters_.received.load(); }
  uint64_t shm_bytes_sent() const { return shm_counters_.sent.load(); }
  struct ShmCounters {
    std::atomic<uint64_t> received{0};
    std::atomic<uint64_t> sent{0};
  };
  // Connections closed since the start for what the peer sent or did not prove, by reason:
  // tls_handshake (a TLS handshake that failed), tls_record (a record TLS refuses after it: one
  // that fails its check, one in the clear, an alert), auth (the job's data secret not proven in
  // time or proven wrong), frame (a malformed or oversized frame), limit (over max_connections).
  struct Refusals {
    std::atomic<uint64_t> tls_handshake{0};
    std::atomic<uint64_t> tls_record{0};
    std::atomic<uint64_t> auth{0};
    std::atomic<uint64_t> frame{0};
    std::atomic<uint64_t> limit{0};
  };
  const Refusals& refusals() const { return refusals_; }
  // Stops accepting, ends every connection (pending waits are cancelled) and joins the threads.
  void Shutdown();

 private:
  class Conn;
  TcpDataServer() = default;
  void AcceptLoop(int listen_fd, bool is_unix);
  void Reap(bool all);

  TcpDataServerOptions options_;
  PsHandler* handler_ = nullptr;
  Executor* executor_ = nullptr;
  std::shared_ptr<BufferPool> pool_;
  DataPlaneOptions data_plane_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  int unix_fd_ = -1;
  std::string unix_name_;
  std::thread unix_acceptor_;
  std::atomic<bool> stopping_{false};
  ShmCounters shm_counters_;
  Refusals refusals_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_TCP_DATA_SERVER_H_
