// The client side of the TCP data plane (server/tcp_data_server.h): PushPull rounds on one TCP
// connection to a server, framed as in server/tcp_frame.h, in TLS when the server's port speaks
// it (server/tls_stream.h; then values are decrypted into the caller's tensor instead).
//
// No thread of its own: the calling threads drive the (non-blocking) socket. One thread at a
// time owns the socket's I/O; it writes queued frames and reads replies as the socket allows,
// dispatching each reply to its round, until what it waits for is done: Send() until its frames
// are out, Wait() until its round is complete. Dense float32 values are received straight into
// the caller's tensor (no copy); other values through a pooled buffer. A thread that waits while
// another owns the I/O sleeps until its round completes or the I/O is free. So a round trip
// costs the two wake-ups of a plain TCP echo, and sending and receiving overlap as in one.
#ifndef PSCLUSTER_SERVER_CLIENT_TCP_CONN_H_
#define PSCLUSTER_SERVER_CLIENT_TCP_CONN_H_

#include <poll.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/data_auth.h"
#include "proto/ps.pb.h"
#include "server/buffer_pool.h"
#include "server/client/data_conn.h"
#include "server/client/socket_setup.h"
#include "server/shm_ring.h"
#include "server/tcp_frame.h"
#include "server/tls_stream.h"

namespace pscluster {

class TcpConn : public DataConn {
 public:
  // Connects to host:port (the host of the server's gRPC address, its advertised data port)
  // and authenticates with `auth` (server/client/socket_setup.h; no secret: no proof, which a
  // server that authenticates its callers refuses), in TLS with `tls` (a client context: the
  // server's certificate is checked against `host`). `peer` names the server in errors. A
  // thread waiting for a reply checks the socket for up to `spin` before it sleeps.
  static absl::StatusOr<std::shared_ptr<TcpConn>> Open(const std::string& host, int port,
                                                       const std::string& peer,
                                                       absl::Duration connect_timeout,
                                                       std::shared_ptr<BufferPool> pool,
                                                       absl::Duration spin,
                                                       const DataAuth& auth = {},
                                                       const TlsContext* tls = nullptr);
  // Connects to the server's abstract Unix socket `name` (same host and network namespace) and
  // checks that the peer is process `pid` (the server's, from its Status); the same frames as
  // over TCP follow, the authentication first. With `shm_ring_bytes` > 0 it first offers the server shared memory with two
  // rings of that size (server/shm_ring.h): if the server takes it, payloads go through it
  // instead of the socket; if it refuses, or the memory cannot be made, the socket carries them.
  static absl::StatusOr<std::shared_ptr<TcpConn>> OpenUnix(const std::string& name, uint32_t pid,
                                                           const std::string& peer,
                                                           std::shared_ptr<BufferPool> pool,
                                                           absl::Duration spin,
                                                           size_t shm_ring_bytes = 0,
                                                           const DataAuth& auth = {});
  ~TcpConn() override;

  absl::Status Send(const std::shared_ptr<Round>& round,
                    std::vector<grpc::ByteBuffer> messages) override;
  absl::Status Wait(const std::shared_ptr<Round>& round, absl::Time deadline) override;
  // Drives the connections of one call (rounds[i] on conns[i], one per server) together from
  // this thread until every round is complete, one round failed, or `deadline`: all sockets
  // in one poll, so that each server's replies are read (and its next frames written) as they
  // come instead of server by server. Connections another thread drives are left to it. Waiting
  // on each round afterwards (Wait) gives its result. Returns how many connections it drove (0
  // when fewer than two were free: then it leaves them all to Wait).
  static size_t WaitAll(absl::Span<TcpConn* const> conns,
                      absl::Span<const std::shared_ptr<Round>> rounds, absl::Time deadline);
  void Forget(uint64_t request_id) override;
  void Cancel() override;
  void Retire() override;
  void Shutdown(absl::Duration timeout) override;
  bool done() const override;
  bool usable() const override;
  absl::Time opened() const override { return opened_; }
  const char* transport() const override {
    return is_unix_ ? (shm_ != nullptr ? "unix+shm" : "unix") : "tcp";
  }
  // Whether payloads go through shared memory.
  bool shared_memory() const { return shm_ != nullptr; }

 private:
  // The frame being received (owned by the I/O owner).
  struct Incoming {
    enum class Stage { kHeader, kPrefix, kPayload } stage = Stage::kHeader;
    unsigned char header[kFrameHeaderBytes];
    size_t got = 0;
    FrameHeader h;
    std::string prefix;  // PullChunk without its values (or a status frame's text).
    v1::PullChunk chunk;
    std::shared_ptr<Round> round;  // Entered round (nullptr: the payload is dropped).
    bool direct = false;           // Payload goes straight to the caller's memory.
    char* dst = nullptr;
    BufferPool::Buffer buf;        // Or into this pooled buffer.
    size_t remaining = 0;
    uint64_t position = 0;         // Kind 3: the payload's place in the reply ring.
  };

  TcpConn(int fd, std::unique_ptr<DataIo> io, int wake_fd, std::string peer,
          std::shared_ptr<BufferPool> pool, absl::Duration spin, bool is_unix = false,
          std::unique_ptr<ShmArea> shm = nullptr)
      : is_unix_(is_unix),
        shm_(std::move(shm)),
        fd_(fd),
        io_(std::move(io)),
        wake_fd_(wake_fd),
        peer_(std::move(peer)),
        pool_(std::move(pool)),
        opened_(absl::Now()),
        spin_(spin) {}

  // Send() with shared memory: payload by payload into the request ring, each frame sent as soon
  // as its payload is in.
  absl::Status SendThroughRing(const std::shared_ptr<Round>& round,
                               std::vector<grpc::ByteBuffer> messages);
  // Has queued frames written: by this thread if the I/O is free (what the socket takes now),
  // else by the owner, woken through wake_fd_.
  void Kick();
  // Becomes the I/O owner if nobody is; false otherwise.
  bool TryOwn();
  void Disown();
  // As the I/O owner: writes and reads until `stop()` or `deadline`, or the connection broke;
  // with `until_full`, also as soon as the socket takes no more (the rest is written by the
  // next owner, normally the thread waiting for the round).
  // `poll_first`: nothing was read since the last look, so ask poll() before recv().
  void Drive(absl::FunctionRef<bool()> stop, absl::Time deadline, bool until_full = false,
             bool poll_first = false);
  // As the I/O owner: `round` is complete and nothing queued is left to write (frames of other
  // threads' calls included), so the owner may let go.
  bool Settled(const Round& round);
  enum class Progress { kBlocked, kDone, kBroken };
  // As the I/O owner, without blocking: writes what the socket takes, reads what it has (if
  // `*readable`). kDone when `stop()` (or, with `until_full`, the socket is full); kBroken when
  // the connection broke (cleaned up); kBlocked when only the socket can move it on.
  Progress Step(absl::FunctionRef<bool()> stop, bool until_full, bool* readable);
  // The poll() entries (socket, wake-up eventfd) for the owner's next wait, and taking their
  // events: true when the socket may be read.
  void PollEvents(pollfd* p) const;
  bool TookEvents(const pollfd* p);
  // Reads what the socket has, or until a frame ends with `stop()` true; a non-OK status ends
  // the connection with it.
  absl::Status ReadAvailable(absl::FunctionRef<bool()> stop);
  absl::Status OnPrefix();
  void FinishFrame();
  // As the I/O owner of a broken connection: ends the frame in progress and drops what was
  // being written.
  void CleanUp();
  void Break(const absl::Status& st);

  const bool is_unix_;
  // Shared memory the server attached (Unix sockets only): frames are built into its request
  // ring under mu_, in the order they join writes_; replies are copied out of its reply ring by
  // the I/O owner.
  const std::unique_ptr<ShmArea> shm_;
  const int fd_;
  const std::unique_ptr<DataIo> io_;  // The socket's byte stream (TLS or not), used by the owner.
  const int wake_fd_;  // eventfd: frames were queued for the I/O owner to send.
  const std::string peer_;
  const std::shared_ptr<BufferPool> pool_;
  const absl::Time opened_;
  const absl::Duration spin_;

  // Owned by the I/O owner.
  Incoming in_;
  std::optional<OutFrame> out_;
  std::vector<char> rbuf_ = std::vector<char>(64 << 10);  // Received, not yet taken.
  size_t rpos_ = 0;
  size_t rend_ = 0;

  mutable absl::Mutex mu_;
  bool owned_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Round>> rounds_ ABSL_GUARDED_BY(mu_);
  std::deque<OutFrame> writes_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // No new rounds.
  bool retiring_ ABSL_GUARDED_BY(mu_) = false; // Close once no round is pending.
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t completions_ ABSL_GUARDED_BY(mu_) = 0;  // Bumped when a round may have completed.
};

// IsLocalHost: server/client/socket_setup.h.

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_TCP_CONN_H_
