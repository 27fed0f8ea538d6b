// A client's long-lived data-plane connection to one server, carrying many rounds (distinct
// request_ids) at once: the gRPC PushPull stream (PsStream) or the TCP data plane
// (TcpConn). Replies are dispatched to their Round by request_id; a broken connection fails its
// pending rounds, and the owner opens a new one.
#ifndef PSCLUSTER_SERVER_CLIENT_DATA_CONN_H_
#define PSCLUSTER_SERVER_CLIENT_DATA_CONN_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/client/round.h"

namespace pscluster {

class DataConn {
 public:
  virtual ~DataConn() = default;
  // Registers `round` and sends (or queues) its messages. UNAVAILABLE when closing.
  virtual absl::Status Send(const std::shared_ptr<Round>& round,
                            std::vector<grpc::ByteBuffer> messages) = 0;
  // Waits until `round` is complete or failed, or `deadline` (DEADLINE_EXCEEDED); afterwards no
  // reply is written into the caller's memory any more. A transport may do its receiving on
  // the waiting thread.
  virtual absl::Status Wait(const std::shared_ptr<Round>& round, absl::Time deadline) {
    return round->Wait(deadline);
  }
  // Drops a round (it timed out); late replies to it are ignored.
  virtual void Forget(uint64_t request_id) = 0;
  // Ends the connection now; pending rounds fail with CANCELLED and the caller's memory is
  // released promptly.
  virtual void Cancel() = 0;
  // Takes no new rounds and closes once the pending ones are answered.
  virtual void Retire() = 0;
  // Cancels and waits (up to `timeout`) until the transport let go of the connection.
  virtual void Shutdown(absl::Duration timeout) = 0;
  virtual bool done() const = 0;
  virtual bool usable() const = 0;
  virtual absl::Time opened() const = 0;
  // "grpc" or "tcp".
  virtual const char* transport() const = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_DATA_CONN_H_
