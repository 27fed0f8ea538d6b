#include "server/client/ps_client.h"

#include <algorithm>
#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/dtype.h"
#include "common/sharding.h"
#include "common/status_convert.h"
#include "grpcpp/generic/generic_stub.h"
#include "server/buffer_pool.h"
#include "common/logging.h"
#include "server/client/dialer.h"
#include "server/client/ps_stream.h"
#include "server/client/tcp_conn.h"
#include "server/tcp_frame.h"
#include "server/client/round.h"
#include "server/wire.h"

namespace pscluster {
namespace {

struct ClientTable {
  v1::TableSpec spec;
  uint64_t hash = 0;
  bool dense = true;
  uint64_t elems = 0;
  uint64_t block_elems = 0;
  uint64_t num_blocks = 0;
  uint32_t width = 1;
  v1::DataType transport = v1::DT_FLOAT32;
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
    if (o.data_transport != DataTransport::kGrpc && !o.channel.tls.enabled()) {
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
    stream = PsStream::Open(generic.get(), address, o.stream_lifetime, o.channel);
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
};

// The distinct keys of a sparse request per server, and where each caller position's key went.
struct KeyRoute {
  std::vector<std::vector<uint64_t>> keys;       // Per server: distinct keys, first-seen order.
  std::vector<std::vector<uint32_t>> first_pos;  // Per server: caller position of each key.
  std::vector<std::pair<int, uint32_t>> where;   // Per caller position: (server, index).
};

void ReleaseRoundSlice(void* p) {
  auto* round = static_cast<std::shared_ptr<Round>*>(p);
  (*round)->ReleaseSlice();
  delete round;
}

bool IsRetryable(const absl::Status& st) {
  return st.code() == absl::StatusCode::kUnavailable ||
         st.code() == absl::StatusCode::kFailedPrecondition ||
         st.code() == absl::StatusCode::kCancelled;
}

}  // namespace

struct PsClient::Impl {
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
                    const PullTargets* dst, int64_t pull_clock, bool end_of_step,
                    std::vector<std::vector<Planned>>* plans, CallScratch* scratch);
  absl::Status Attempt(const Routing& r, int64_t step, uint64_t seq, const PushSources* src,
                       const PullTargets* dst, int64_t pull_clock, bool end_of_step,
                       absl::Time deadline, int64_t* min_clock);
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

// ------------------------------------------------------------------ setup

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(PsClientOptions options,
                                                           v1::ShardMap map,
                                                           std::vector<v1::TableSpec> tables) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  if (impl->options.channel.int_args.empty()) {
    impl->options.channel.int_args = *DataPlaneChannelArgs();
  }
  if (impl->options.job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
  if (impl->options.chunk_bytes < 4096) {
    return absl::InvalidArgumentError("chunk_bytes: must be at least 4096");
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    ClientTable t;
    t.spec = tables[i];
    t.hash = TableHash(t.spec.name());
    t.dense = t.spec.kind() == v1::DENSE;
    if (t.spec.kind() != v1::DENSE && t.spec.kind() != v1::SPARSE) {
      return absl::InvalidArgumentError(absl::StrCat("tables[", i, "].kind: DENSE or SPARSE"));
    }
    if (t.dense) {
      t.elems = 1;
      for (uint64_t d : t.spec.shape().dims()) t.elems *= d;
      t.block_elems = t.spec.block_elems() ? t.spec.block_elems() : kDefaultBlockElems;
      t.num_blocks = NumBlocks(t.elems, t.block_elems);
    } else {
      t.width = t.spec.row_width();
      if (t.width == 0) return absl::InvalidArgumentError(absl::StrCat("tables[", i, "].row_width: 0"));
    }
    t.transport = t.spec.compression().transport() == v1::DT_INVALID
                      ? v1::DT_FLOAT32
                      : t.spec.compression().transport();
    if (!impl->by_name.emplace(t.spec.name(), static_cast<int>(impl->tables.size())).second) {
      return absl::InvalidArgumentError(absl::StrCat("tables[", i, "].name: '", t.spec.name(),
                                                     "' twice"));
    }
    impl->tables.push_back(std::move(t));
  }
  {
    absl::MutexLock l(&impl->mu);
    auto r = impl->Build(std::move(map));
    if (!r.ok()) return r.status();
    impl->routing = *r;
  }
  return std::unique_ptr<PsClient>(new PsClient(std::move(impl)));
}

PsClient::PsClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PsClient::~PsClient() = default;

absl::StatusOr<std::shared_ptr<const Routing>> PsClient::Impl::Build(v1::ShardMap map) {
  if (map.job_id() != options.job_id) {
    return absl::InvalidArgumentError(absl::StrCat("map.job_id: '", map.job_id(),
                                                   "' is not this client's job '", options.job_id,
                                                   "'"));
  }
  if (map.num_virtual_shards() == 0 ||
      static_cast<uint32_t>(map.assignments_size()) != map.num_virtual_shards()) {
    return absl::InvalidArgumentError("map.assignments: need exactly one per virtual shard");
  }
  auto r = std::make_shared<Routing>();
  absl::flat_hash_map<std::string, int> index;
  for (int i = 0; i < map.servers_size(); ++i) {
    const auto& s = map.servers(i);
    index[s.node_id()] = i;
    auto& conn = conns[s.address()];
    if (!conn) {
      auto ch = MakeChannel(s.address(), options.channel);
      if (!ch.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("map.servers[", i, "].address: ",
                                                       ch.status().message()));
      }
      conn = std::make_shared<Connection>();
      conn->address = s.address();
      conn->channel = *ch;
      conn->stub = v1::ParameterServer::NewStub(conn->channel);
      conn->generic = std::make_unique<grpc::GenericStub>(conn->channel);
      conn->pool = pool;
    }
    r->servers.push_back(conn);
  }
  r->shard_server.resize(map.num_virtual_shards());
  for (int s = 0; s < map.assignments_size(); ++s) {
    const auto& a = map.assignments(s);
    auto it = index.find(a.primary());
    if (a.shard() != static_cast<uint32_t>(s) || it == index.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "map.assignments[", s, "]: shard ", a.shard(), " names server '", a.primary(),
          "' missing from map.servers"));
    }
    r->shard_server[s] = it->second;
  }
  for (const auto& t : tables) {
    std::vector<int> blocks;
    if (t.dense) {
      blocks.resize(t.num_blocks);
      for (uint64_t b = 0; b < t.num_blocks; ++b) {
        blocks[b] = r->shard_server[ShardOfBlock(t.hash, b, map.num_virtual_shards())];
      }
    }
    r->block_server.push_back(std::move(blocks));
  }
  r->map = std::move(map);
  return std::shared_ptr<const Routing>(r);
}

absl::Status PsClient::SetShardMap(v1::ShardMap map) {
  absl::MutexLock l(&impl_->mu);
  if (impl_->routing && map.epoch() <= impl_->routing->map.epoch()) return absl::OkStatus();
  auto r = impl_->Build(std::move(map));
  if (!r.ok()) return r.status();
  impl_->routing = *r;
  return absl::OkStatus();
}

v1::ShardMap PsClient::shard_map() const { return impl_->current()->map; }

const ClientTable* PsClient::Impl::Find(const std::string& name, absl::string_view field) const {
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : &tables[it->second];
}

// ------------------------------------------------------------------ planning

absl::StatusOr<KeyRoute> PsClient::Impl::RouteKeys(const Routing& r, const ClientTable& t,
                                                   absl::Span<const uint64_t> keys,
                                                   absl::string_view field) const {
  KeyRoute route;
  route.keys.resize(r.servers.size());
  route.first_pos.resize(r.servers.size());
  route.where.resize(keys.size());
  std::vector<absl::flat_hash_map<uint64_t, uint32_t>> index(r.servers.size());
  for (size_t k = 0; k < keys.size(); ++k) {
    const uint64_t key = keys[k];
    if (t.spec.key_space() != 0 && key >= t.spec.key_space()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".keys: key ", key,
                                                     " outside table '", t.spec.name(), "'"));
    }
    const int srv = r.shard_server[ShardOfKey(t.hash, key, r.map.num_virtual_shards())];
    auto [it, fresh] = index[srv].emplace(key, static_cast<uint32_t>(route.keys[srv].size()));
    if (fresh) {
      route.keys[srv].push_back(key);
      route.first_pos[srv].push_back(static_cast<uint32_t>(k));
    }
    route.where[k] = {srv, it->second};
  }
  return route;
}

absl::Status PsClient::Impl::Plan(const Routing& r, int64_t step, uint64_t seq,
                                  const PushSources* src, const PullTargets* dst,
                                  int64_t pull_clock, bool end_of_step,
                                  std::vector<std::vector<Planned>>* plans,
                                  CallScratch* scratch) {
  plans->assign(r.servers.size(), {});
  auto header = [&](const ClientTable& t) {
    v1::PushChunk h;
    auto* tag = h.mutable_tag();
    tag->set_job_id(options.job_id);
    tag->set_worker(options.worker);
    tag->set_step(step);
    tag->set_seq(seq);
    tag->set_attempt(options.attempt);
    h.set_epoch(r.map.epoch());
    h.mutable_slice()->set_table(t.spec.name());
    h.set_dtype(t.transport);
    return h;
  };
  auto pull_dest = [&](Planned* p, const ClientTable& t, uint64_t elems) {
    p->header.set_pull_after(true);
    p->header.set_pull_clock(pull_clock);
    p->dest.elems = elems;
    p->dest.dtype = t.transport;
  };
  // Dense tables pulled as a whole, by name (pushes of the same table carry the pull along).
  absl::flat_hash_map<std::string, float*> dense_pull;
  if (dst) {
    for (size_t i = 0; i < dst->dense.size(); ++i) {
      const auto& d = dst->dense[i];
      const ClientTable* t = Find(d.table, "");
      if (t == nullptr || !t->dense || d.data == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("targets.dense[", i, "]: '", d.table,
                                                       "' is not a dense table of job '",
                                                       options.job_id, "' (or data is null)"));
      }
      dense_pull[d.table] = d.data;
    }
  }
  std::vector<std::vector<Planned>> pull_only(r.servers.size());
  // ---- Pushes.
  if (src) {
    for (size_t i = 0; i < src->dense.size(); ++i) {
      const auto& s = src->dense[i];
      const ClientTable* t = Find(s.table, "");
      if (t == nullptr || !t->dense || s.grad == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("sources.dense[", i, "]: '", s.table,
                                                       "' is not a dense table of job '",
                                                       options.job_id, "' (or grad is null)"));
      }
      auto pull = dense_pull.find(s.table);
      float* pull_to = pull == dense_pull.end() ? nullptr : pull->second;
      if (pull_to) dense_pull.erase(pull);
      const int ti = by_name.at(s.table);
      for (uint64_t b = 0; b < t->num_blocks; ++b) {
        const uint64_t first = b * t->block_elems;
        const uint64_t n = std::min(t->block_elems, t->elems - first);
        Planned p;
        p.header = header(*t);
        p.header.mutable_slice()->set_block(b);
        if (t->transport == v1::DT_FLOAT32) {
          p.borrowed = reinterpret_cast<const char*>(s.grad + first);
          p.borrowed_bytes = n * 4;
        } else {
          p.owned_bytes = n * DTypeSize(t->transport);
          p.owned = pool->Acquire(p.owned_bytes);
          EncodeFloats(s.grad + first, n, t->transport, p.owned.data);
        }
        if (pull_to) {
          pull_dest(&p, *t, n);
          p.dest.base = pull_to + first;
        }
        (*plans)[r.block_server[ti][b]].push_back(std::move(p));
      }
    }
    for (size_t i = 0; i < src->sparse.size(); ++i) {
      const auto& s = src->sparse[i];
      const ClientTable* t = Find(s.table, "");
      if (t == nullptr || t->dense || (s.grads == nullptr && !s.keys.empty())) {
        return absl::InvalidArgumentError(absl::StrCat("sources.sparse[", i, "]: '", s.table,
                                                       "' is not a sparse table of job '",
                                                       options.job_id, "' (or grads is null)"));
      }
      const uint32_t w = t->width;
      auto route = RouteKeys(r, *t, s.keys, absl::StrCat("sources.sparse[", i, "]"));
      if (!route.ok()) return route.status();
      const auto& keys = route->keys;
      // Per server: the rows of its distinct keys, duplicates summed.
      std::vector<std::vector<float>> sums(r.servers.size());
      for (size_t srv = 0; srv < sums.size(); ++srv) sums[srv].assign(keys[srv].size() * w, 0.f);
      for (size_t k = 0; k < s.keys.size(); ++k) {
        const auto [srv, idx] = route->where[k];
        float* dstrow = sums[srv].data() + static_cast<size_t>(idx) * w;
        const float* g = s.grads + k * w;
        for (uint32_t j = 0; j < w; ++j) dstrow[j] += g[j];
      }
      const size_t es = DTypeSize(t->transport);
      const size_t rows_per_chunk = std::max<size_t>(1, options.chunk_bytes / (w * es));
      for (size_t srv = 0; srv < r.servers.size(); ++srv) {
        for (size_t at = 0; at < keys[srv].size(); at += rows_per_chunk) {
          const size_t rows = std::min(rows_per_chunk, keys[srv].size() - at);
          Planned p;
          p.header = header(*t);
          p.header.mutable_slice()->set_keys(
              std::string(reinterpret_cast<const char*>(keys[srv].data() + at), rows * 8));
          p.owned_bytes = rows * w * es;
          p.owned = pool->Acquire(p.owned_bytes);
          EncodeFloats(sums[srv].data() + at * w, rows * w, t->transport, p.owned.data);
          (*plans)[srv].push_back(std::move(p));
        }
      }
    }
  }
  // ---- Pulls.
  if (dst) {
    for (const auto& [name, data] : dense_pull) {  // Dense tables not pushed in this call.
      const ClientTable* t = Find(name, "");
      const int ti = by_name.at(name);
      for (uint64_t b = 0; b < t->num_blocks; ++b) {
        const uint64_t first = b * t->block_elems;
        const uint64_t n = std::min(t->block_elems, t->elems - first);
        Planned p;
        p.header = header(*t);
        p.header.mutable_slice()->set_block(b);
        pull_dest(&p, *t, n);
        p.dest.base = data + first;
        pull_only[r.block_server[ti][b]].push_back(std::move(p));
      }
    }
    for (size_t i = 0; i < dst->sparse.size(); ++i) {
      const auto& d = dst->sparse[i];
      const ClientTable* t = Find(d.table, "");
      if (t == nullptr || t->dense || (d.rows == nullptr && !d.keys.empty())) {
        return absl::InvalidArgumentError(absl::StrCat("targets.sparse[", i, "]: '", d.table,
                                                       "' is not a sparse table of job '",
                                                       options.job_id, "' (or rows is null)"));
      }
      const uint32_t w = t->width;
      auto route = RouteKeys(r, *t, d.keys, absl::StrCat("targets.sparse[", i, "]"));
      if (!route.ok()) return route.status();
      const auto& keys = route->keys;
      // Replies land at each key's first position; repeated keys are copied there afterwards.
      std::vector<std::vector<uint32_t>*> pos(r.servers.size());
      for (size_t srv = 0; srv < pos.size(); ++srv) {
        scratch->positions.push_back(
            std::make_unique<std::vector<uint32_t>>(std::move(route->first_pos[srv])));
        pos[srv] = scratch->positions.back().get();
      }
      for (size_t k = 0; k < d.keys.size(); ++k) {
        const auto [srv, idx] = route->where[k];
        const uint32_t first_k = (*pos[srv])[idx];
        if (first_k != k) scratch->dups.push_back({d.rows, w, first_k, static_cast<uint32_t>(k)});
      }
      const size_t rows_per_chunk =
          std::max<size_t>(1, options.chunk_bytes / (w * DTypeSize(t->transport)));
      for (size_t srv = 0; srv < r.servers.size(); ++srv) {
        for (size_t at = 0; at < keys[srv].size(); at += rows_per_chunk) {
          const size_t rows = std::min(rows_per_chunk, keys[srv].size() - at);
          Planned p;
          p.header = header(*t);
          p.header.mutable_slice()->set_keys(
              std::string(reinterpret_cast<const char*>(keys[srv].data() + at), rows * 8));
          pull_dest(&p, *t, rows * w);
          p.dest.pos = pos[srv]->data() + at;
          p.dest.width = w;
          p.dest.rows = d.rows;
          pull_only[srv].push_back(std::move(p));
        }
      }
    }
  }
  for (size_t srv = 0; srv < r.servers.size(); ++srv) {
    auto& list = (*plans)[srv];
    for (auto& p : pull_only[srv]) list.push_back(std::move(p));
    if (list.empty() && end_of_step) {
      Planned p;  // Nothing to push here, but the step is complete: advance the clock.
      p.header.mutable_tag()->set_job_id(options.job_id);
      p.header.mutable_tag()->set_worker(options.worker);
      p.header.mutable_tag()->set_step(step);
      p.header.mutable_tag()->set_seq(seq);
      p.header.mutable_tag()->set_attempt(options.attempt);
      p.header.set_epoch(r.map.epoch());
      list.push_back(std::move(p));
    }
    if (!list.empty()) {
      list.back().header.set_last(true);
      if (end_of_step) {
        list.back().header.set_end_of_step(true);
        for (auto& p : list) p.header.set_step_final(true);
      }
    }
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------ sending

absl::Status PsClient::Impl::Attempt(const Routing& r, int64_t step, uint64_t seq,
                                     const PushSources* src, const PullTargets* dst,
                                     int64_t pull_clock, bool end_of_step, absl::Time deadline,
                                     int64_t* min_clock) {
  if (cancelled.load()) return CancelledStatus();
  std::vector<std::vector<Planned>> plans;
  CallScratch scratch;
  absl::Time t0 = absl::Now();
  absl::Status st = Plan(r, step, seq, src, dst, pull_clock, end_of_step, &plans, &scratch);
  absl::Time t1 = absl::Now();
  plan_ns.fetch_add(absl::ToInt64Nanoseconds(t1 - t0));
  if (!st.ok()) {
    for (auto& list : plans) {
      for (auto& p : list) pool->Release(p.owned);
    }
    return st;
  }
  struct Sent {
    std::shared_ptr<DataConn> stream;
    std::shared_ptr<Round> round;
    std::string peer;
  };
  std::vector<Sent> sent;
  absl::Status send_error;
  for (size_t srv = 0; srv < plans.size(); ++srv) {
    auto& list = plans[srv];
    if (list.empty()) continue;
    const uint64_t id = next_request_id.fetch_add(1);
    std::vector<ReplyDest> dests;
    dests.reserve(list.size());
    for (const auto& p : list) dests.push_back(p.dest);
    auto round = std::make_shared<Round>(id, std::move(dests), &copy_ns);
    {
      absl::MutexLock l(&active_mu);
      active[round.get()] = round;
    }
    if (cancelled.load()) round->Fail(CancelledStatus());
    std::vector<grpc::ByteBuffer> msgs;
    msgs.reserve(list.size());
    for (auto& p : list) {
      p.header.set_request_id(id);
      std::vector<grpc::Slice> payload;
      if (p.borrowed_bytes > 0 && p.borrowed_bytes <= options.copy_below_bytes) {
        // Small payloads are copied: cheaper than waiting for gRPC to release the caller's
        // memory after the write.
        payload.emplace_back(p.borrowed, p.borrowed_bytes);
      } else if (p.borrowed_bytes > 0) {
        round->AddSlice();
        payload.emplace_back(const_cast<char*>(p.borrowed), p.borrowed_bytes, &ReleaseRoundSlice,
                             new std::shared_ptr<Round>(round));
      } else if (p.owned.data != nullptr) {
        payload.push_back(pool->ToSlice(p.owned, p.owned_bytes));
        p.owned = {};
      }
      msgs.push_back(EncodeWithPayload(p.header, kPushChunkValuesField, std::move(payload)));
    }
    if (!send_error.ok()) continue;  // Release the rest without sending.
    auto stream = r.servers[srv]->GetStream(options);
    st = stream->Send(round, std::move(msgs));
    if (!st.ok()) {
      send_error = st;
      continue;
    }
    sent.push_back({stream, round, r.servers[srv]->address});
  }
  absl::Status result = send_error;
  int64_t min = -1;
  t0 = absl::Now();
  send_ns.fetch_add(absl::ToInt64Nanoseconds(t0 - t1));
  if (sent.size() > 1) {
    // Several servers on the TCP data plane: read each one's replies (and write its remaining
    // frames) as they come, not server by server.
    std::vector<TcpConn*> conns;
    std::vector<std::shared_ptr<Round>> rounds;
    for (auto& s : sent) {
      if (auto* c = dynamic_cast<TcpConn*>(s.stream.get())) {
        conns.push_back(c);
        rounds.push_back(s.round);
      }
    }
    if (conns.size() > 1 && TcpConn::WaitAll(conns, rounds, deadline) > 1) {
      joint_waits.fetch_add(1);
    }
  }
  for (auto& s : sent) {
    absl::Status rs = s.stream->Wait(s.round, deadline);
    if (rs.code() == absl::StatusCode::kDeadlineExceeded || cancelled.load()) {
      s.stream->Forget(s.round->request_id());
      s.stream->Cancel();  // Makes gRPC let go of the caller's memory promptly.
      if (rs.code() == absl::StatusCode::kDeadlineExceeded) {
        rs = absl::DeadlineExceededError(absl::StrCat(s.peer, ": ", rs.message()));
      }
    }
    if (!rs.ok() && (result.ok() || rs.code() == absl::StatusCode::kFailedPrecondition)) {
      result = rs;
    }
    int64_t m = s.round->min_clock();
    if (m >= 0 && (min < 0 || m < min)) min = m;
  }
  for (auto& s : sent) s.round->WaitSlicesReleased();
  {
    absl::MutexLock l(&active_mu);
    for (auto& s : sent) active.erase(s.round.get());
  }
  wait_ns.fetch_add(absl::ToInt64Nanoseconds(absl::Now() - t0));
  if (!result.ok()) return result;
  for (const auto& d : scratch.dups) {
    std::copy_n(d.rows + static_cast<size_t>(d.from) * d.width, d.width,
                d.rows + static_cast<size_t>(d.to) * d.width);
  }
  if (min_clock) *min_clock = min;
  return absl::OkStatus();
}

absl::Status PsClient::Impl::Refresh(const absl::Status& cause) {
  if (!options.refresh_shard_map) return cause;
  auto map = options.refresh_shard_map();
  if (!map.ok()) {
    return absl::Status(map.status().code(),
                        absl::StrCat("refreshing the shard map after \"", cause.message(),
                                     "\": ", map.status().message()));
  }
  absl::MutexLock l(&mu);
  if (routing && map->epoch() <= routing->map.epoch()) return absl::OkStatus();
  auto r = Build(std::move(*map));
  if (!r.ok()) return r.status();
  routing = *r;
  return absl::OkStatus();
}

absl::Status PsClient::Impl::Run(int64_t step, const PushSources* src, const PullTargets* dst,
                                 int64_t pull_clock, bool end_of_step, int64_t* min_clock) {
  const absl::Time deadline = absl::Now() + options.call_timeout;
  uint64_t seq = 0;
  if (src != nullptr) {
    absl::MutexLock l(&seq_mu);
    if (step != seq_step) {
      seq_step = step;
      next_seq = 0;
      failed_seqs.clear();
    }
    if (!failed_seqs.empty()) {
      seq = *failed_seqs.begin();
      failed_seqs.erase(failed_seqs.begin());
    } else {
      seq = next_seq++;
    }
  }
  auto give_back = [&](const absl::Status& st) {
    if (src != nullptr && !st.ok()) {
      absl::MutexLock l(&seq_mu);
      if (step == seq_step) failed_seqs.insert(seq);
    }
    return st;
  };
  absl::Duration backoff = options.retry_backoff;
  while (true) {
    auto r = current();
    absl::Status st = Attempt(*r, step, seq, src, dst, pull_clock, end_of_step, deadline, min_clock);
    if (st.ok()) calls.fetch_add(1);
    if (!st.ok() && cancelled.load()) return give_back(CancelledStatus());
    // A server that does not know the job restarted and lost it. Under a scheduler (which
    // notices the restart and recovers the job, stopping this task) that is waited out like an
    // unreachable server, so that the task does not fail the job first.
    const bool job_lost = options.refresh_shard_map &&
                          st.code() == absl::StatusCode::kNotFound &&
                          absl::StrContains(st.message(), "unknown job");
    if (st.ok() || !(IsRetryable(st) || job_lost)) return give_back(st);
    retries.fetch_add(1);
    if (absl::Now() + backoff >= deadline) return give_back(st);
    if (st.code() == absl::StatusCode::kFailedPrecondition) {
      if (!options.refresh_shard_map) return give_back(st);
      absl::Status rs = Refresh(st);
      if (!rs.ok()) return give_back(rs);
      if (current()->map.epoch() > r->map.epoch()) continue;  // Retry at once with the new map.
    }
    Backoff(backoff);
    if (cancelled.load()) return give_back(CancelledStatus());
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

namespace {

// Observes the time from construction to destruction into `h` (when set).
class Timed {
 public:
  explicit Timed(Histogram* h) : h_(h), t0_(h != nullptr ? absl::Now() : absl::InfinitePast()) {}
  ~Timed() {
    if (h_ != nullptr) h_->ObserveSeconds(absl::Now() - t0_);
  }

 private:
  Histogram* const h_;
  const absl::Time t0_;
};

}  // namespace

absl::Status PsClient::Pull(int64_t clock, const PullTargets& targets) {
  Timed timed(impl_->options.latency != nullptr ? impl_->options.latency->pull : nullptr);
  int64_t min = -1;
  absl::Status st = impl_->Run(clock, nullptr, &targets, clock, false, &min);
  if (st.ok()) last_min_clock_ = min;
  return st;
}

absl::Status PsClient::Push(int64_t step, const PushSources& sources, bool end_of_step) {
  Timed timed(impl_->options.latency != nullptr ? impl_->options.latency->push : nullptr);
  return impl_->Run(step, &sources, nullptr, 0, end_of_step, nullptr);
}

absl::Status PsClient::PushPull(int64_t step, const PushSources& sources,
                                const PullTargets& targets) {
  Timed timed(impl_->options.latency != nullptr ? impl_->options.latency->push_pull : nullptr);
  int64_t min = -1;
  absl::Status st = impl_->Run(step, &sources, &targets, step + 1, true, &min);
  if (st.ok()) last_min_clock_ = min;
  return st;
}

void PsClient::Cancel() {
  impl_->cancelled.store(true);
  std::vector<std::shared_ptr<Round>> rounds;
  {
    absl::MutexLock l(&impl_->active_mu);
    for (auto& [unused, weak] : impl_->active) {
      if (auto r = weak.lock()) rounds.push_back(std::move(r));
    }
  }
  for (auto& r : rounds) r->Fail(impl_->CancelledStatus());
}

PsClient::Stats PsClient::stats() const {
  Stats s;
  s.plan_sec = impl_->plan_ns.load() * 1e-9;
  s.send_sec = impl_->send_ns.load() * 1e-9;
  s.wait_sec = impl_->wait_ns.load() * 1e-9;
  s.copy_sec = impl_->copy_ns.load() * 1e-9;
  s.calls = impl_->calls.load();
  s.retries = impl_->retries.load();
  s.joint_waits = impl_->joint_waits.load();
  return s;
}

// ------------------------------------------------------------------ control calls

template <typename Resp>
std::vector<absl::Status> PsClient::Impl::ForAll(
    const Routing& r, std::vector<Resp>* out,
    const std::function<void(v1::ParameterServer::Stub*, grpc::ClientContext*, int, Resp*,
                             std::function<void(grpc::Status)>)>& call) {
  const size_t n = r.servers.size();
  out->assign(n, Resp());
  std::vector<absl::Status> statuses(n);
  const absl::Time deadline = absl::Now() + options.call_timeout;
  std::vector<bool> pending(n, true);
  absl::Duration backoff = options.retry_backoff;
  while (true) {
    std::vector<std::unique_ptr<grpc::ClientContext>> ctxs(n);
    std::vector<grpc::Status> raw(n);
    int count = 0;
    for (size_t i = 0; i < n; ++i) count += pending[i];
    absl::BlockingCounter done(count);
    for (size_t i = 0; i < n; ++i) {
      if (!pending[i]) continue;
      ctxs[i] = CallContext(deadline - absl::Now(), options.channel);
      call(r.servers[i]->stub.get(), ctxs[i].get(), static_cast<int>(i), &(*out)[i],
           [&raw, &done, i](grpc::Status s) {
             raw[i] = std::move(s);
             done.DecrementCount();
           });
    }
    done.Wait();
    bool again = false;
    for (size_t i = 0; i < n; ++i) {
      if (!pending[i]) continue;
      statuses[i] = FromGrpcStatus(raw[i], absl::StrCat("server ", r.map.servers(i).node_id(),
                                                        " (", r.servers[i]->address, ")"));
      pending[i] = statuses[i].code() == absl::StatusCode::kUnavailable;
      again |= pending[i];
    }
    if (!again || absl::Now() + backoff >= deadline || cancelled.load()) return statuses;
    Backoff(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

absl::Status PsClient::CreateTables(const v1::ConsistencySpec& consistency, uint32_t num_workers,
                                    uint32_t checkpoint_every_steps,
                                    const std::string& checkpoint_dir) {
  auto r = impl_->current();
  v1::CreateTablesRequest req;
  req.set_job_id(impl_->options.job_id);
  for (const auto& t : impl_->tables) *req.add_tables() = t.spec;
  *req.mutable_consistency() = consistency;
  req.set_num_workers(num_workers);
  req.set_num_virtual_shards(r->map.num_virtual_shards());
  req.set_checkpoint_every_steps(checkpoint_every_steps);
  req.set_checkpoint_dir(checkpoint_dir);
  std::vector<v1::CreateTablesResponse> out;
  for (const auto& st : impl_->ForAll<v1::CreateTablesResponse>(
           *r, &out, [&](auto* stub, auto* ctx, int, auto* resp, auto done) {
             stub->async()->CreateTables(ctx, &req, resp, std::move(done));
           })) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status PsClient::InstallShardMap() {
  auto r = impl_->current();
  std::vector<v1::UpdateShardMapRequest> reqs(r->servers.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    *reqs[i].mutable_map() = r->map;
    reqs[i].set_self(r->map.servers(i).node_id());
  }
  std::vector<v1::UpdateShardMapResponse> out;
  for (const auto& st : impl_->ForAll<v1::UpdateShardMapResponse>(
           *r, &out, [&](auto* stub, auto* ctx, int i, auto* resp, auto done) {
             stub->async()->UpdateShardMap(ctx, &reqs[i], resp, std::move(done));
           })) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::ServerStatus>> PsClient::ServerStatuses() {
  auto r = impl_->current();
  v1::ServerStatusRequest req;
  req.set_job_id(impl_->options.job_id);
  std::vector<v1::ServerStatus> out;
  for (const auto& st : impl_->ForAll<v1::ServerStatus>(
           *r, &out, [&](auto* stub, auto* ctx, int, auto* resp, auto done) {
             stub->async()->Status(ctx, &req, resp, std::move(done));
           })) {
    if (!st.ok()) return st;
  }
  return out;
}

absl::StatusOr<std::vector<v1::CheckpointResponse>> PsClient::Checkpoint(const std::string& dir) {
  auto r = impl_->current();
  v1::CheckpointRequest req;
  req.set_job_id(impl_->options.job_id);
  req.set_dir(dir);
  std::vector<v1::CheckpointResponse> out;
  for (const auto& st : impl_->ForAll<v1::CheckpointResponse>(
           *r, &out, [&](auto* stub, auto* ctx, int, auto* resp, auto done) {
             stub->async()->Checkpoint(ctx, &req, resp, std::move(done));
           })) {
    if (!st.ok()) return st;
  }
  return out;
}

absl::Status PsClient::DropJob() {
  auto r = impl_->current();
  v1::DropJobRequest req;
  req.set_job_id(impl_->options.job_id);
  std::vector<v1::DropJobResponse> out;
  for (const auto& st : impl_->ForAll<v1::DropJobResponse>(
           *r, &out, [&](auto* stub, auto* ctx, int, auto* resp, auto done) {
             stub->async()->DropJob(ctx, &req, resp, std::move(done));
           })) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace pscluster
