// The parameter client's inside, shared by its two source files: ps_client.cc (setup, the
// public calls, retries, control calls) and ps_client_rounds.cc (planning a round's chunks per
// server, and sending them and waiting for the replies). Not for use outside PsClient.
#ifndef PSCLUSTER_SERVER_CLIENT_PS_CLIENT_IMPL_H_
#define PSCLUSTER_SERVER_CLIENT_PS_CLIENT_IMPL_H_

#include <algorithm>
#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/compression_spec.h"
#include "common/dtype.h"
#include "common/grad_compress.h"
#include "common/sharding.h"
#include "common/status_convert.h"
#include "grpcpp/generic/generic_stub.h"
#include "server/buffer_pool.h"
#include "common/logging.h"
#include "server/client/dialer.h"
#include "server/client/error_feedback.h"
#include "server/client/ps_client.h"
#include "server/client/ps_stream.h"
#include "server/client/tcp_conn.h"
#include "server/tcp_frame.h"
#include "server/client/round.h"
#include "server/wire.h"

namespace pscluster {
namespace client_detail {

// Pull compression (CompressionSpec.pull_topk_ratio) on the client: what it holds of each block
// of a dense table (what the block's server keeps as its view of this worker) and each block's
// view id. A reply that sends only what changed is applied here, then the block is copied to
// the caller. One call at a time uses it (`busy`); a concurrent call pulls the table whole.
struct PullMirror {
  explicit PullMirror(uint64_t elems, uint64_t blocks) : values(elems, 0.f), views(blocks, 0) {}
  std::vector<float> values;
  std::vector<uint64_t> views;  // PullChunk.view of each block's last reply; 0 = none.
  std::atomic<bool> busy{false};
};

struct ClientTable {
  v1::TableSpec spec;
  uint64_t hash = 0;
  bool dense = true;
  uint64_t elems = 0;
  uint64_t block_elems = 0;
  uint64_t num_blocks = 0;
  uint32_t width = 1;
  v1::DataType transport = v1::DT_FLOAT32;
  std::shared_ptr<PullMirror> mirror;  // Dense tables with pull compression.
};

// A connection that could not be opened: every round sent on it fails with the reason.
class FailedConn : public DataConn {
 public:
  explicit FailedConn(absl::Status why) : why_(std::move(why)) {}
  absl::Status Send(const std::shared_ptr<Round>&, std::vector<grpc::ByteBuffer>) override {
    return why_;
  }
  void Forget(uint64_t) override {}
  void Cancel() override {}
  void Retire() override {}
  void Shutdown(absl::Duration) override {}
  bool done() const override { return true; }
  bool usable() const override { return false; }
  absl::Time opened() const override { return absl::InfinitePast(); }
  const char* transport() const override { return "tcp"; }

 private:
  const absl::Status why_;
};

struct Connection {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::ParameterServer::Stub> stub;
  std::unique_ptr<grpc::GenericStub> generic;
  std::shared_ptr<BufferPool> pool;
  absl::Mutex mu;
  std::shared_ptr<DataConn> stream ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<DataConn>> retired ABSL_GUARDED_BY(mu);  // Still finishing.
  bool warned ABSL_GUARDED_BY(mu) = false;  // Fell back to gRPC once (logged).
  bool announced ABSL_GUARDED_BY(mu) = false;  // Logged which data plane it uses.

  std::shared_ptr<DataConn> GetStream(const PsClientOptions& o) {
    absl::MutexLock l(&mu);
    absl::Duration refresh_after = o.stream_lifetime - 2 * o.call_timeout;
    if (stream && stream->usable() &&
        (refresh_after <= absl::ZeroDuration() || absl::Now() - stream->opened() < refresh_after)) {
      return stream;
    }
    retired.erase(std::remove_if(retired.begin(), retired.end(),
                                 [](const auto& s) { return s->done(); }),
                  retired.end());
    if (stream) {
      stream->Retire();
      retired.push_back(std::move(stream));
    }
    if (o.connector != nullptr) {
      absl::StatusOr<std::shared_ptr<DataConn>> opened = o.connector->OpenData(address);
      if (!opened.ok()) {
        stream = std::make_shared<FailedConn>(opened.status());
        return stream;
      }
      if (*opened != nullptr) {
        stream = std::move(*opened);
        return stream;
      }
    } else if (o.data_transport != DataTransport::kGrpc) {
      absl::StatusOr<std::shared_ptr<DataConn>> tcp = Dial(o);
      if (tcp.ok()) {
        stream = std::move(*tcp);
        if (!announced) {
          announced = true;
          Logger("worker")->info("data plane to {} over {}", address, stream->transport());
        }
        return stream;
      }
      if (o.data_transport == DataTransport::kTcp || o.data_transport == DataTransport::kUnix) {
        // Required: a stream that is already closed makes the call fail with this reason.
        stream = std::make_shared<FailedConn>(tcp.status());
        return stream;
      }
      if (!warned) {
        warned = true;
        Logger("worker")->info("data plane to {} over gRPC: {}", address, tcp.status());
      }
    }
    stream = PsStream::Open(generic.get(), address, o.stream_lifetime, o.channel,
                            DataAuth{o.job_id, o.worker, o.attempt, o.data_secret});
    return stream;
  }

  // The server's Unix socket or TCP port, as `o.data_transport` allows (dialer.h); an error
  // when neither can be used.
  absl::StatusOr<std::shared_ptr<DataConn>> Dial(const PsClientOptions& o) {
    DialOptions d;
    d.transport = o.data_transport;
    d.timeout = std::min(o.call_timeout, absl::Seconds(10));
    d.channel = o.channel;
    d.pool = pool;
    d.spin = o.spin;
    d.shm_ring_bytes = o.shm_ring_bytes;
    d.auth = DataAuth{o.job_id, o.worker, o.attempt, o.data_secret};
    absl::StatusOr<Dialed> dialed = DialDataConn(stub.get(), address, d);
    if (!dialed.ok()) return dialed.status();
    if (dialed->conn == nullptr) return dialed->why_none;
    return std::shared_ptr<DataConn>(std::move(dialed->conn));
  }

  ~Connection() {
    // Streams end here, on this thread, before the channel goes (see PsStream::Shutdown).
    absl::MutexLock l(&mu);
    if (stream) retired.push_back(std::move(stream));
    for (auto& s : retired) s->Shutdown(absl::Seconds(10));
  }
};

// A shard map ready for routing.
struct Routing {
  v1::ShardMap map;
  std::vector<std::shared_ptr<Connection>> servers;  // In map.servers order.
  std::vector<int> shard_server;                      // Virtual shard -> server index.
  std::vector<std::vector<int>> block_server;         // Dense table -> block -> server index.
};

// One chunk to send: its header, where its reply goes, and its payload.
struct Planned {
  v1::PushChunk header;
  ReplyDest dest;
  const char* borrowed = nullptr;  // Caller memory sent as is.
  size_t borrowed_bytes = 0;
  BufferPool::Buffer owned;        // Or a pooled buffer holding the payload.
  size_t owned_bytes = 0;
};

// Per-call memory that reply destinations point into.
struct CallScratch {
  std::vector<std::unique_ptr<std::vector<uint32_t>>> positions;
  struct Dup {
    float* rows;
    uint32_t width;
    uint32_t from, to;  // Row positions in the caller's buffer.
  };
  std::vector<Dup> dups;
  // Pull mirrors this call uses (PullMirror::busy taken), given back when the call's attempt ends.
  std::vector<std::shared_ptr<PullMirror>> mirrors;
  CallScratch() = default;
  CallScratch(const CallScratch&) = delete;
  CallScratch& operator=(const CallScratch&) = delete;
  ~CallScratch() {
    for (auto& m : mirrors) m->busy.store(false);
  }
};

// The distinct keys of a sparse request per server, and where each caller position's key went.
struct KeyRoute {
  std::vector<std::vector<uint64_t>> keys;       // Per server: distinct keys, first-seen order.
  std::vector<std::vector<uint32_t>> first_pos;  // Per server: caller position of each key.
  std::vector<std::pair<int, uint32_t>> where;   // Per caller position: (server, index).
};

// A call's compressed dense pushes (error_feedback.h), by table index: made once per call, the
// same for every attempt of it.
using pscluster::CompressedBlock;
using CompressedPushes = absl::flat_hash_map<int, std::vector<CompressedBlock>>;

inline void ReleaseRoundSlice(void* p) {
  auto* round = static_cast<std::shared_ptr<Round>*>(p);
  (*round)->ReleaseSlice();
  delete round;
}

inline bool IsRetryable(const absl::Status& st) {
  return st.code() == absl::StatusCode::kUnavailable ||
         st.code() == absl::StatusCode::kFailedPrecondition ||
         st.code() == absl::StatusCode::kCancelled;
}

}  // namespace client_detail

struct PsClient::Impl {
  using ClientTable = client_detail::ClientTable;
  using FailedConn = client_detail::FailedConn;
  using Connection = client_detail::Connection;
  using Routing = client_detail::Routing;
  using Planned = client_detail::Planned;
  using CallScratch = client_detail::CallScratch;
  using KeyRoute = client_detail::KeyRoute;
  using CompressedPushes = client_detail::CompressedPushes;

  PsClientOptions options;
  std::vector<ClientTable> tables;
  absl::flat_hash_map<std::string, int> by_name;
  std::shared_ptr<BufferPool> pool = BufferPool::Create(64 << 20);
  std::atomic<uint64_t> next_request_id{1};

  absl::Mutex mu;
  std::shared_ptr<const Routing> routing ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, std::shared_ptr<Connection>> conns ABSL_GUARDED_BY(mu);

  std::atomic<int64_t> plan_ns{0}, send_ns{0}, wait_ns{0}, copy_ns{0};
  std::atomic<uint64_t> calls{0}, retries{0}, joint_waits{0};

  // Cancel(): every round in flight fails with CANCELLED and later calls do too.
  std::atomic<bool> cancelled{false};
  absl::Mutex active_mu;
  absl::flat_hash_map<Round*, std::weak_ptr<Round>> active ABSL_GUARDED_BY(active_mu);
  absl::Status CancelledStatus() const {
    return absl::CancelledError("the data-plane client was cancelled (task stopping)");
  }
  // Sleeps `d` before a retry, or less once the client is cancelled (a stopping task should not
  // sit out a one-second backoff).
  void Backoff(absl::Duration d) const {
    const absl::Time end = absl::Now() + d;
    for (absl::Time now = absl::Now(); now < end && !cancelled.load(); now = absl::Now()) {
      absl::SleepFor(std::min(end - now, absl::Milliseconds(10)));
    }
  }

  // Push sequence numbers of the current step: a push takes the lowest seq that failed before
  // (so retrying a failed push reuses its tags), else a new one.
  absl::Mutex seq_mu;
  int64_t seq_step ABSL_GUARDED_BY(seq_mu) = -1;
  uint64_t next_seq ABSL_GUARDED_BY(seq_mu) = 0;
  std::set<uint64_t> failed_seqs ABSL_GUARDED_BY(seq_mu);

  // Error feedback of the dense tables pushed compressed (top-k or int8), by table index.
  absl::Mutex feedback_mu;
  absl::flat_hash_map<int, std::unique_ptr<ErrorFeedback>> feedback ABSL_GUARDED_BY(feedback_mu);
  // The compressed pushes of `step` for the sources of compressed tables.
  absl::Status Compress(int64_t step, const PushSources& src, CompressedPushes* out);

  std::shared_ptr<const Routing> current() {
    absl::MutexLock l(&mu);
    return routing;
  }

  absl::StatusOr<std::shared_ptr<const Routing>> Build(v1::ShardMap map) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  const ClientTable* Find(const std::string& name, absl::string_view field) const;

  absl::StatusOr<KeyRoute> RouteKeys(const Routing& r, const ClientTable& t,
                                     absl::Span<const uint64_t> keys,
                                     absl::string_view field) const;
  absl::Status Plan(const Routing& r, int64_t step, uint64_t seq, const PushSources* src,
                    const CompressedPushes& compressed, const PullTargets* dst,
                    int64_t pull_clock, bool end_of_step,
                    std::vector<std::vector<Planned>>* plans, CallScratch* scratch);
  absl::Status Attempt(const Routing& r, int64_t step, uint64_t seq, const PushSources* src,
                       const CompressedPushes& compressed, const PullTargets* dst,
                       int64_t pull_clock, bool end_of_step, absl::Time deadline,
                       int64_t* min_clock);
  absl::Status Run(int64_t step, const PushSources* src, const PullTargets* dst,
                   int64_t pull_clock, bool end_of_step, int64_t* min_clock);
  absl::Status Refresh(const absl::Status& cause);

  // Calls `call` on every server in parallel; statuses by server index.
  template <typename Resp>
  std::vector<absl::Status> ForAll(
      const Routing& r, std::vector<Resp>* out,
      const std::function<void(v1::ParameterServer::Stub*, grpc::ClientContext*, int, Resp*,
                               std::function<void(grpc::Status)>)>& call);
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_PS_CLIENT_IMPL_H_
