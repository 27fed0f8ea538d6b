// Framing of the TCP data plane (server/tcp_data_server.h, server/client/tcp_conn.h).
//
// A connection carries the same messages as the gRPC PushPull stream (PushChunk from the client,
// PullChunk back; plain protobuf bytes, see server/wire.h), each behind a 16-byte header:
//
//   magic  u32  "PSD1" (0x31445350, little-endian)
//   kind   u32  1 = message, 2 = status (the server ends the stream)
//   length u32  bytes that follow
//   aux    u32  message: how many of the last bytes are the raw `values` payload (so a reader
//               can place them straight into their destination); status: the gRPC status code,
//               the text being the status message
//
// Over a Unix socket with shared memory attached (server/shm_ring.h) two more kinds:
//
//   kind 3  a message whose payload lies in the sender's ring: `length` counts the message
//           without its payload and then the payload's u64 ring position; `aux` is the payload's
//           size (not part of `length`). The receiver puts the payload back behind the message.
//   kind 4  attach: from the client, the first frame after authentication, with the memfd as SCM_RIGHTS
//           and a 16-byte body (the request and reply rings' sizes, u64 each); the server
//           answers with a kind-4 header whose `aux` is 1 (attached) or 0 (refused: the
//           connection goes on without shared memory).
//
// Every connection (TCP or Unix) starts with an authentication exchange (common/data_auth.h)
// before any other frame:
//
//   kind 5  challenge: from the server as soon as it accepts, body = a 32-byte random nonce,
//           `aux` 1 when the server requires a proof (it authenticates its callers), else 0
//   kind 6  auth: from the client, body = worker u32, attempt u32, the proof (`aux` bytes: 32,
//           or 0 for none), the job id (the rest); the server answers with a kind-6 header of
//           `aux` 1 (accepted; the connection carries that job's messages, or with no proof
//           only those of jobs without a secret) or with a status frame, and closes
//
// All integers little-endian. Frames larger than kMaxFrameBytes, unknown kinds and a wrong magic
// are protocol errors: the receiver closes the connection.
#ifndef PSCLUSTER_SERVER_TCP_FRAME_H_
#define PSCLUSTER_SERVER_TCP_FRAME_H_

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "server/data_io.h"
#include "server/shm_ring.h"

namespace pscluster {

inline constexpr uint32_t kTcpFrameMagic = 0x31445350;
inline constexpr uint32_t kFrameMessage = 1;
inline constexpr uint32_t kFrameStatus = 2;
inline constexpr uint32_t kFrameShmMessage = 3;
inline constexpr uint32_t kFrameAttach = 4;
inline constexpr uint32_t kFrameChallenge = 5;
inline constexpr uint32_t kFrameAuth = 6;
// Largest auth body: worker, attempt, a proof and a job id of up to 1 KiB.
inline constexpr uint32_t kMaxAuthFrameBytes = 8 + 32 + 1024;
inline constexpr size_t kShmPositionBytes = 8;
inline constexpr uint32_t kMaxFrameBytes = 80u << 20;
inline constexpr size_t kFrameHeaderBytes = 16;

struct FrameHeader {
  uint32_t kind = 0;
  uint32_t length = 0;
  uint32_t aux = 0;
};

// One frame on its way out. Holds references to the message's slices, so the caller's
// ByteBuffer may go as soon as the frame is built.
class OutFrame {
 public:
  // A message frame; `msg` as built by EncodeWithPayload / SerializeSmall (a payload, if any, is
  // every slice after the first).
  static absl::StatusOr<OutFrame> Message(const grpc::ByteBuffer& msg);
  // The same message with its payload copied into `ring` when it is large enough and the ring
  // has room (a kind-3 frame); otherwise as Message(). Frames must be sent in the order they
  // are built, as the reader releases ring space in that order.
  static absl::StatusOr<OutFrame> Message(const grpc::ByteBuffer& msg, ShmRing* ring);
  // A header of `kind` with `length` and `aux` and the given body.
  static OutFrame Raw(uint32_t kind, uint32_t aux, std::string body);
  // Payload bytes this frame placed in a ring (0: none, the payload goes inline).
  size_t shm_bytes() const { return shm_bytes_; }
  // A status frame.
  static OutFrame Status(int code, const std::string& message);

  OutFrame(OutFrame&&) = default;
  OutFrame& operator=(OutFrame&&) = default;

  // Sends what the socket takes now without waiting. Returns true when the whole frame is out.
  absl::StatusOr<bool> SendSome(DataIo& io);
  absl::StatusOr<bool> SendSome(int fd) {
    DataIo io(fd);
    return SendSome(io);
  }
  // Sends the rest, waiting as needed (the socket's send timeout applies).
  absl::Status SendRest(DataIo& io);
  absl::Status SendRest(int fd) {
    DataIo io(fd);
    return SendRest(io);
  }
  bool sent() const { return iov_pos_ >= iov_.size(); }

 private:
  OutFrame() = default;
  void BuildIov();
  // Advances past `n` sent bytes.
  void Consume(size_t n);

  // Header (and a status frame's text): on the heap, so iov_ stays valid when the frame moves.
  std::unique_ptr<char[]> head_;
  size_t head_len_ = 0;
  // A kind-3 frame's ring position is sent after the message: in head_, after the header.
  size_t shm_bytes_ = 0;
  std::vector<grpc::Slice> slices_;
  std::vector<iovec> iov_;
  size_t iov_pos_ = 0;
};

// Reads exactly `n` bytes. A peer that closes before the first byte gives OUT_OF_RANGE (a clean
// end) when `eof_ok`; elsewhere UNAVAILABLE. `stall`: longest wait for any progress once the
// first byte arrived (infinite: none).
absl::Status ReadFull(DataIo& io, void* data, size_t n, bool eof_ok = false,
                      absl::Duration stall = absl::InfiniteDuration());
inline absl::Status ReadFull(int fd, void* data, size_t n, bool eof_ok = false,
                             absl::Duration stall = absl::InfiniteDuration()) {
  DataIo io(fd);
  return ReadFull(io, data, n, eof_ok, stall);
}

// Checks the kFrameHeaderBytes at `p` (INVALID_ARGUMENT on a protocol error).
absl::StatusOr<FrameHeader> ParseFrameHeader(const unsigned char* p);

// Reads and checks a frame header (OUT_OF_RANGE on a clean end; INVALID_ARGUMENT on a
// protocol error).
absl::StatusOr<FrameHeader> ReadFrameHeader(int fd);

// Buffered blocking reads from a socket: one recv() takes a small frame whole (header and body)
// and whatever follows it; large bodies go from the socket straight to their destination.
class FrameReader {
 public:
  // Before sleeping on an empty socket the reader checks it for up to `spin`.
  explicit FrameReader(DataIo* io, absl::Duration spin = absl::ZeroDuration(),
                       size_t buffer_bytes = 64 << 10)
      : io_(io), spin_(spin), buf_(buffer_bytes) {}
  // As ReadFull: exactly `n` bytes; OUT_OF_RANGE for a clean end before the first byte when
  // `eof_ok`; `stall` bounds the wait for progress once the first byte is in.
  absl::Status Read(void* data, size_t n, bool eof_ok, absl::Duration stall);

 private:
  DataIo* const io_;
  const absl::Duration spin_;
  std::vector<char> buf_;
  size_t pos_ = 0;
  size_t end_ = 0;
};

uint64_t GetU64(const unsigned char* p);
void PutU64(char* p, uint64_t v);

// An attach frame (kind 4) announcing rings of `request` and `reply` bytes.
std::string AttachFrame(uint64_t request, uint64_t reply);
// A whole auth frame (kind 6) claiming `job_id`, `worker`, `attempt` with `proof` (may be empty).
std::string AuthFrame(const std::string& job_id, uint32_t worker, uint32_t attempt,
                      const std::string& proof);
// The body of an auth frame with a `proof_bytes`-byte proof: INVALID_ARGUMENT when malformed.
struct AuthClaim {
  std::string job_id;
  uint32_t worker = 0;
  uint32_t attempt = 0;
  std::string proof;
};
absl::StatusOr<AuthClaim> ParseAuthBody(const std::string& body, uint32_t proof_bytes);
// sendmsg() of `bytes` with the file descriptor `passed` as SCM_RIGHTS (none when -1); returns
// sendmsg()'s result.
ssize_t SendWithFd(int fd, const std::string& bytes, int passed, int flags);

// Reads `n` bytes and throws them away.
absl::Status Discard(int fd, size_t n, absl::Duration stall);

// Socket options for data-plane connections: TCP_NODELAY, keep-alive (buffer sizes stay
// autotuned), and a send timeout so a peer that stopped reading cannot hold a thread forever.
void TuneDataSocket(int fd, absl::Duration send_timeout);
// Unix data sockets also get a send buffer that holds a few chunks (an AF_UNIX stream has no
// receive buffer of its own; the kernel caps the size at net.core.wmem_max).
void TuneUnixDataSocket(int fd);

// host and port of "host:port" / "[v6]:port".
absl::Status SplitHostPort(const std::string& address, std::string* host, std::string* port);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_TCP_FRAME_H_
