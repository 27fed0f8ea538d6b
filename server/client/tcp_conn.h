// The client side of the plaintext TCP data plane (server/tcp_data_server.h): PushPull rounds on
// one TCP connection to a server, framed as in server/tcp_frame.h.
//
// Messages are written by the calling thread (a second caller queues its messages behind the
// first, which writes them too); one reader thread dispatches replies to their rounds and
// receives dense float32 values straight into the caller's tensor (no copy), others through a
// pooled buffer.
#ifndef PSCLUSTER_SERVER_CLIENT_TCP_CONN_H_
#define PSCLUSTER_SERVER_CLIENT_TCP_CONN_H_

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/buffer_pool.h"
#include "server/client/data_conn.h"

namespace pscluster {

class TcpConn : public DataConn {
 public:
  // Connects to host:port (the host of the server's gRPC address, its advertised data port).
  // `peer` names the server in errors. A write the server does not take within `send_timeout`
  // fails the connection.
  static absl::StatusOr<std::shared_ptr<TcpConn>> Open(const std::string& host, int port,
                                                       const std::string& peer,
                                                       absl::Duration connect_timeout,
                                                       absl::Duration send_timeout,
                                                       std::shared_ptr<BufferPool> pool);
  ~TcpConn() override;

  absl::Status Send(const std::shared_ptr<Round>& round,
                    std::vector<grpc::ByteBuffer> messages) override;
  void Forget(uint64_t request_id) override;
  void Cancel() override;
  void Retire() override;
  void Shutdown(absl::Duration timeout) override;
  bool done() const override;
  bool usable() const override;
  absl::Time opened() const override { return opened_; }
  const char* transport() const override { return "tcp"; }

 private:
  TcpConn(int fd, std::string peer, std::shared_ptr<BufferPool> pool)
      : fd_(fd), peer_(std::move(peer)), pool_(std::move(pool)), opened_(absl::Now()) {}
  void ReadLoop();
  // Handles one message frame; an error breaks the connection.
  absl::Status ReadMessage(uint32_t length, uint32_t payload_bytes);
  void DrainWrites();
  // Ends the connection with `st` for every pending round.
  void Break(const absl::Status& st);
  void MaybeHalfClose();

  const int fd_;
  const std::string peer_;
  const std::shared_ptr<BufferPool> pool_;
  const absl::Time opened_;
  std::thread reader_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Round>> rounds_ ABSL_GUARDED_BY(mu_);
  std::deque<grpc::ByteBuffer> writes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;    // No new rounds.
  bool retiring_ ABSL_GUARDED_BY(mu_) = false;   // Half-close when idle.
  bool half_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;
  std::string prefix_;  // Reader thread only.
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_TCP_CONN_H_
