// A long-lived PushPull stream to one server carrying many rounds (distinct request_ids) at
// once: writes are queued and sent one at a time, replies are dispatched to their round by
// request_id. A broken stream fails its pending rounds with the call's status; the owner opens
// a new one.
//
// Thread model: Send() from any thread; reactions on gRPC threads. `mu_` guards the round table
// and write queue; gRPC operations are started without holding it. The stream object lives
// until both its owner dropped it and gRPC called OnDone (it holds a reference to itself until
// then).
#ifndef PSCLUSTER_SERVER_CLIENT_PS_STREAM_H_
#define PSCLUSTER_SERVER_CLIENT_PS_STREAM_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "common/data_auth.h"
#include "grpcpp/generic/generic_stub.h"
#include "server/client/data_conn.h"
#include "server/client/round.h"

namespace pscluster {

class PsStream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                 public DataConn {
 public:
  // Opens /pscluster.v1.ParameterServer/PushPull on `stub`'s channel with a deadline
  // `lifetime` from now. `peer` names the server in errors.
  // `auth`: the job's data secret, proven in the call's metadata (common/data_auth.h; none
  // when auth.secret is empty).
  static std::shared_ptr<PsStream> Open(grpc::GenericStub* stub, const std::string& peer,
                                        absl::Duration lifetime, const ChannelOptions& channel,
                                        const DataAuth& auth);

  // Registers `round` and queues its messages. UNAVAILABLE when the stream is closing.
  absl::Status Send(const std::shared_ptr<Round>& round,
                    std::vector<grpc::ByteBuffer> messages) override;
  // Drops a round (it timed out); late replies to it are ignored.
  void Forget(uint64_t request_id) override;
  // Cancels the call; pending rounds fail with CANCELLED.
  void Cancel() override;
  // Half-closes once no round is pending; then the stream ends.
  void Retire() override;
  // Cancels the call and waits (up to `timeout`) until gRPC is done with it, so that the owner
  // releases the channel on its own thread: the last reference to a channel must not be
  // dropped on a gRPC callback thread (gRPC would join that thread from itself).
  void Shutdown(absl::Duration timeout) override;
  bool done() const override { return done_->HasBeenNotified(); }

  bool usable() const override;
  absl::Time opened() const override { return opened_; }
  const char* transport() const override { return "grpc"; }

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  PsStream(std::string peer) : peer_(std::move(peer)) {}
  void StartNextWrite();
  // Marks the stream closing; releases the hold once no operation is being started.
  void BeginClose(bool half_close) ABSL_LOCKS_EXCLUDED(mu_);
  void EndOp();
  void FailAll(const absl::Status& st);

  const std::string peer_;
  grpc::ClientContext ctx_;
  absl::Time opened_;
  std::shared_ptr<PsStream> self_;  // Until OnDone.
  // Outlives the stream: OnDone notifies it after dropping self_.
  std::shared_ptr<absl::Notification> done_ = std::make_shared<absl::Notification>();

  mutable absl::Mutex mu_;
  grpc::ByteBuffer read_buf_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Round>> rounds_ ABSL_GUARDED_BY(mu_);
  std::deque<grpc::ByteBuffer> writes_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer current_write_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;    // No new rounds.
  bool retiring_ ABSL_GUARDED_BY(mu_) = false;   // Close when idle.
  bool half_close_ ABSL_GUARDED_BY(mu_) = false; // WritesDone wanted.
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
  int starting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_PS_STREAM_H_
