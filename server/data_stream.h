// The server side of one data-plane call (Pull, Push or PushPull): receives chunks, applies them
// in order on the executor, serves reads once the job's consistency allows (parking them without
// a thread otherwise), and streams replies back as zero-copy slices, a bounded number at a time.
//
// Thread model: reactions (OnReadDone/OnWriteDone/OnCancel) arrive on gRPC threads; applies and
// reads run on executor threads through two serial queues (applies in arrival order; reads in
// arrival order, each waiting for its clock). `mu_` guards the call state. gRPC operations are
// started without holding `mu_`, and Finish is issued only when no operation is being started
// and no write is outstanding, so the reactor is never used after it finished.
#ifndef PSCLUSTER_SERVER_DATA_STREAM_H_
#define PSCLUSTER_SERVER_DATA_STREAM_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/data_auth.h"
#include "common/executor.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"
#include "server/buffer_pool.h"
#include "server/ps_handler.h"

namespace pscluster {

struct DataPlaneOptions {
  // Pull replies are cut into chunks of at most this many payload bytes.
  size_t chunk_bytes = 4 << 20;
  // Chunks up to this size are applied on the receiving thread (gRPC's, or a TCP connection's
  // reader) when the stream is idle (saves a thread hand-off); larger ones go to the executor.
  size_t inline_bytes = 64 << 10;
  // Chunks received but not yet applied, per call, before reading pauses (flow control).
  int max_queued_chunks = 8;
  // Replies produced but not yet taken by gRPC, per call, before reads pause.
  int max_pending_writes = 3;
};

class DataStream : public std::enable_shared_from_this<DataStream> {
 public:
  enum class Mode { kPull, kPush, kPushPull };
  // The reactor's operations. Never called after `finish`.
  struct Ops {
    std::function<void(grpc::ByteBuffer*)> start_read;
    std::function<void(const grpc::ByteBuffer*)> start_write;
    std::function<void(grpc::Status)> finish;
  };

  static std::shared_ptr<DataStream> Create(Mode mode, PsHandler* handler, Executor* executor,
                                            std::shared_ptr<BufferPool> pool,
                                            const DataPlaneOptions& options, Ops ops);
  ~DataStream();

  // kPull: serves `request`. kPush/kPushPull: starts reading; kPush answers into `response`.
  void StartPull(const grpc::ByteBuffer& request);
  void StartReading(grpc::ByteBuffer* push_response);

  void OnReadDone(bool ok);
  void OnWriteDone(bool ok);
  void OnCancel();
  // The transport broke or the peer violated its protocol: ends the call with `st`.
  void Abort(const absl::Status& st);

  // A data socket's authentication (server/tcp_data_server.h; gRPC calls are authenticated by
  // gRPC and check nothing more): the stream accepts only chunks of `claim.job_id` pushed as
  // `claim.worker` (a replica connection, worker kReplicaWorker: only a primary's copies), or,
  // with no job bound (`bound` false), only chunks of jobs without a data secret. Any other
  // chunk ends the stream (PERMISSION_DENIED / UNAUTHENTICATED). Call before reading starts.
  void SetSocketAuth(bool bound, DataAuth claim);

  // A gRPC call's proof of its job's data secret (the kGrpcDataAuthKey metadata, see
  // common/data_auth.h). A job with a data secret takes chunks and pulls over gRPC only from a
  // call whose proof holds for that job, the chunk's worker and an attempt not fenced off; jobs
  // without one (standalone servers) take any call the token check let through.
  using CallAuth = PsHandler::GrpcDataProof;
  // Call before reading (or the pull) starts.
  void SetCallAuth(CallAuth auth);

 private:
  struct PushItem;
  struct ReadItem;

  DataStream(Mode mode, PsHandler* handler, Executor* executor, std::shared_ptr<BufferPool> pool,
             const DataPlaneOptions& options, Ops ops);
  void Schedule(std::function<void()> fn);

  void MaybeStartRead();
  void ApplyOne(const std::shared_ptr<PushItem>& item);
  void QueueRead(std::shared_ptr<ReadItem> item, bool run_inline);
  void RunRead(const std::shared_ptr<ReadItem>& item, SerialQueue::Done done);
  void ContinueRead(const std::shared_ptr<ReadItem>& item, absl::Status st, SerialQueue::Done done);
  void Produce(const std::shared_ptr<ReadItem>& item, SerialQueue::Done done);
  void Write(grpc::ByteBuffer msg);
  void Fail(const absl::Status& st);
  void RequestFinish(grpc::Status st);
  void MaybeComplete();
  // Ends an operation start; issues Finish if it is now due.
  void EndOp();
  bool FinishDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckSocketAuth(const v1::PushChunk& chunk) const;
  // gRPC calls: checks `job`'s data secret proof for `worker` (once per job and worker).
  absl::Status CheckCallAuth(const std::string& job, uint32_t worker);

  const Mode mode_;
  PsHandler* const handler_;
  Executor* const executor_;
  const std::shared_ptr<BufferPool> pool_;
  const DataPlaneOptions options_;
  const Ops ops_;
  std::unique_ptr<SerialQueue> apply_q_;
  std::unique_ptr<SerialQueue> read_q_;
  // Set before reading starts, then read-only (SetSocketAuth).
  bool socket_ = false;
  bool bound_ = false;
  DataAuth claim_;
  CallAuth call_auth_;
  // The job whose proof this gRPC call passed (reads run one at a time, and a pull has none).
  std::string verified_job_;

  absl::Mutex mu_;
  grpc::ByteBuffer read_buf_;                        // Owned by the outstanding read.
  grpc::ByteBuffer* push_response_ = nullptr;        // kPush.
  bool read_outstanding_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;     // Client half-closed (or kPull).
  int queued_ ABSL_GUARDED_BY(mu_) = 0;              // Chunks received, not applied.
  int reads_pending_ ABSL_GUARDED_BY(mu_) = 0;       // Read items not finished.
  std::map<uint64_t, uint32_t> round_index_ ABSL_GUARDED_BY(mu_);  // request_id -> next index.
  std::deque<grpc::ByteBuffer> writes_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer current_write_;                   // Owned by the outstanding write.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> paused_producer_ ABSL_GUARDED_BY(mu_);
  int starting_ ABSL_GUARDED_BY(mu_) = 0;            // Operations being started.
  bool finish_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Job> parked_job_ ABSL_GUARDED_BY(mu_);
  uint64_t parked_id_ ABSL_GUARDED_BY(mu_) = 0;
  // kPush acknowledgement.
  uint64_t last_request_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t applied_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t duplicates_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_DATA_STREAM_H_
