// Shared memory beside a Unix data connection (server/tcp_frame.h, kFrameShmMessage): a worker on
// its server's host can have the payloads of its frames travel through memory both processes
// map, so that the socket carries only the small messages around them. The kernel then neither
// copies the payloads into and out of socket buffers nor runs its socket machinery per 64 KiB.
//
// The worker creates the area (a sealed memfd: it cannot shrink under the server, which would
// fault) and passes it over the socket with its attach frame. The area holds two rings, each
// written by one side and read by the other in frame order:
//
//   bytes [0, 4096)                          control: magic, the two ring sizes, and one
//                                            "consumed" counter per ring, each on its own line
//   [4096, 4096 + request)                   the request ring: the worker writes, the server reads
//   [4096 + request, 4096 + request + reply) the reply ring: the server writes, the worker reads
//
// A frame names its payload by a position: a byte count since the ring began, so position % size
// is the offset; a payload never wraps (the writer skips the ring's end instead), and a writer
// that finds everything read starts again at the ring's beginning, so a steady exchange keeps
// reusing the same warm memory. The reader
// copies the payload out when it reads the frame and then publishes position + length as its
// ring's consumed counter; the writer reuses space only below that counter. When a ring has no
// room the frame carries its payload inline over the socket, as without shared memory, so a slow
// reader slows nothing down and nothing waits on the other process.
//
// The other process is not trusted with this process' memory: positions read from a frame are
// checked against the ring, and a consumed counter read from the area is clamped to what was
// written. What it writes into the area can only garble its own payloads.
#ifndef PSCLUSTER_SERVER_SHM_RING_H_
#define PSCLUSTER_SERVER_SHM_RING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"

namespace pscluster {

inline constexpr size_t kShmControlBytes = 4096;
inline constexpr uint64_t kShmMagic = 0x3130304d48535350ull;  // "PSSHM001", little-endian.
// Payloads smaller than this go inline: a copy into the ring saves nothing on them.
inline constexpr size_t kShmMinPayloadBytes = 16 << 10;

// One ring of an area, as seen by its writer or its reader.
class ShmRing {
 public:
  ShmRing(char* base, size_t size, uint64_t* consumed) : base_(base), size_(size),
                                                         consumed_(consumed) {}

  // Writer: room for `n` bytes starting on a 64-byte boundary, or nullopt when the reader has not
  // consumed enough yet (or `n` exceeds the ring). Returns the position to send; the bytes go to
  // At(position). Reservations must reach the reader in the order they are made.
  std::optional<uint64_t> Reserve(size_t n);
  char* At(uint64_t position) const { return base_ + position % size_; }

  // Reader: where a payload of `n` bytes at `position` lies (INVALID_ARGUMENT when it does not
  // lie inside the ring), and, once it is copied out, handing its space back to the writer.
  absl::StatusOr<const char*> Locate(uint64_t position, size_t n) const;
  void Release(uint64_t position, size_t n);

  size_t size() const { return size_; }

 private:
  char* const base_;
  const size_t size_;
  uint64_t* const consumed_;  // In the shared control page.
  uint64_t head_ = 0;         // Writer: end of the last reservation.
  uint64_t gap_from_ = 0;     // Writer: the skip of the last restart, [gap_from_, gap_to_).
  uint64_t gap_to_ = 0;
};

// A mapped area: its two rings and the memfd behind it.
class ShmArea {
 public:
  // Worker: a new sealed memfd with rings of `request_bytes` and `reply_bytes` (each rounded up
  // to 64 KiB), mapped.
  static absl::StatusOr<std::unique_ptr<ShmArea>> Create(size_t request_bytes,
                                                         size_t reply_bytes);
  // Server: maps the memfd a worker passed, after checking that it is sealed against shrinking,
  // that its size and control page agree with the attach frame's ring sizes, and that it is at
  // most `max_bytes`. Takes ownership of `fd` in every case.
  static absl::StatusOr<std::unique_ptr<ShmArea>> Attach(int fd, uint64_t request_bytes,
                                                         uint64_t reply_bytes, size_t max_bytes);
  ~ShmArea();

  int fd() const { return fd_; }
  size_t request_bytes() const { return request_bytes_; }
  size_t reply_bytes() const { return reply_bytes_; }
  ShmRing& request() { return request_; }
  ShmRing& reply() { return reply_; }

 private:
  ShmArea(int fd, char* base, size_t request_bytes, size_t reply_bytes);

  const int fd_;
  char* const base_;
  const size_t request_bytes_;
  const size_t reply_bytes_;
  ShmRing request_;
  ShmRing reply_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_SHM_RING_H_
