#include "server/client/ps_client.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/data_auth.h"
#include "common/logging.h"
#include "server/client/ps_client_impl.h"

namespace pscluster {

using client_detail::ClientTable;
using client_detail::FailedConn;
using client_detail::Connection;
using client_detail::Routing;
using client_detail::Planned;
using client_detail::CallScratch;
using client_detail::KeyRoute;
using client_detail::IsRetryable;

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
    const v1::CompressionSpec& cs = t.spec.compression();
    if (cs.topk_ratio() != 0 || cs.quantize() != v1::CompressionSpec::QUANTIZE_NONE) {
      absl::Status ok = CheckGradientCompression(t.spec, absl::StrCat("tables[", i, "]"));
      if (!ok.ok()) return ok;
      absl::MutexLock l(&impl->feedback_mu);
      impl->feedback[static_cast<int>(impl->tables.size())] =
          std::make_unique<ErrorFeedback>(t.elems, t.block_elems, cs, t.transport);
    }
    if (CompressesPulls(cs)) {
      absl::Status ok = CheckGradientCompression(t.spec, absl::StrCat("tables[", i, "]"));
      if (!ok.ok()) return ok;
      t.mirror = std::make_shared<client_detail::PullMirror>(t.elems, t.num_blocks);
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
      auto ch = options.connector != nullptr ? options.connector->Channel(s.address())
                                             : MakeChannel(s.address(), options.channel);
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

absl::Status PsClient::Impl::Compress(int64_t step, const PushSources& src,
                                      CompressedPushes* out) {
  absl::MutexLock l(&feedback_mu);
  if (feedback.empty()) return absl::OkStatus();
  for (size_t i = 0; i < src.dense.size(); ++i) {
    auto ti = by_name.find(src.dense[i].table);
    if (ti == by_name.end() || src.dense[i].grad == nullptr) continue;  // Plan names it.
    auto ef = feedback.find(ti->second);
    if (ef == feedback.end()) continue;
    if (out->contains(ti->second)) {
      return absl::InvalidArgumentError(absl::StrCat("sources.dense[", i, "]: table '",
                                                     src.dense[i].table,
                                                     "' is pushed compressed, and twice in "
                                                     "one call"));
    }
    auto blocks = ef->second->Compress(step, src.dense[i].grad);
    if (!blocks.ok()) {
      return absl::Status(blocks.status().code(),
                          absl::StrCat("sources.dense[", i, "]: table '", src.dense[i].table,
                                       "': ", blocks.status().message()));
    }
    (*out)[ti->second] = std::move(*blocks);
  }
  return absl::OkStatus();
}

absl::Status PsClient::Impl::Run(int64_t step, const PushSources* src, const PullTargets* dst,
                                 int64_t pull_clock, bool end_of_step, int64_t* min_clock) {
  const absl::Time deadline = absl::Now() + options.call_timeout;
  CompressedPushes compressed;
  if (src != nullptr) {
    absl::Status cs = Compress(step, *src, &compressed);
    if (!cs.ok()) return cs;
  }
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
    absl::Status st = Attempt(*r, step, seq, src, compressed, dst, pull_clock, end_of_step,
                              deadline, min_clock);
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

absl::StatusOr<std::vector<uint64_t>> PsClient::ListKeys(const std::string& table,
                                                         uint64_t max_keys) {
  const ClientTable* t = impl_->Find(table, "table");
  if (t == nullptr || t->dense) {
    return absl::InvalidArgumentError(
        absl::StrCat("table: '", table, "' is not a sparse table of job ", impl_->options.job_id));
  }
  const PsClientOptions& o = impl_->options;
  const std::string proof =
      GrpcDataAuthValue(DataAuth{o.job_id, o.worker, o.attempt, o.data_secret});
  const absl::Time deadline = absl::Now() + o.call_timeout;
  absl::Duration backoff = o.retry_backoff;
  while (true) {
    auto r = impl_->current();
    std::vector<uint64_t> keys;
    absl::Status st;
    // Each server lists the shards it is primary of: every key once.
    for (size_t i = 0; i < r->servers.size() && st.ok(); ++i) {
      v1::ListKeysRequest req;
      req.set_job_id(o.job_id);
      req.set_table(table);
      req.set_epoch(r->map.epoch());
      req.set_worker(o.worker);
      for (bool more = true; more && st.ok();) {
        if (impl_->cancelled.load()) return impl_->CancelledStatus();
        auto ctx = CallContext(deadline - absl::Now(), o.channel);
        if (!proof.empty()) ctx->AddMetadata(kGrpcDataAuthKey, proof);
        v1::ListKeysResponse resp;
        st = FromGrpcStatus(r->servers[i]->stub->ListKeys(ctx.get(), req, &resp),
                            absl::StrCat("server ", r->map.servers(i).node_id(), " (",
                                         r->servers[i]->address, ")"));
        if (!st.ok()) break;
        const size_t n = resp.keys().size() / sizeof(uint64_t);
        if (resp.keys().size() % sizeof(uint64_t) != 0 || (resp.more() && n == 0) ||
            keys.size() + n > max_keys) {
          if (keys.size() + n > max_keys) {
            return absl::ResourceExhaustedError(absl::StrCat("table '", table, "' holds more than ",
                                                             max_keys, " keys on its servers"));
          }
          return absl::InternalError(
              absl::StrCat("server ", r->map.servers(i).node_id(), ": a malformed page of keys"));
        }
        const size_t at = keys.size();
        keys.resize(at + n);
        std::memcpy(keys.data() + at, resp.keys().data(), n * sizeof(uint64_t));
        more = resp.more();
        if (more) req.set_start(keys.back() + 1);
      }
    }
    if (st.ok()) {
      std::sort(keys.begin(), keys.end());
      return keys;
    }
    // A stale map: refresh and list again; a server restarting: retry with backoff.
    if (!IsRetryable(st) || absl::Now() + backoff >= deadline) return st;
    impl_->retries.fetch_add(1);
    if (st.code() == absl::StatusCode::kFailedPrecondition) {
      if (!o.refresh_shard_map) return st;
      absl::Status rs = impl_->Refresh(st);
      if (!rs.ok()) return rs;
      if (impl_->current()->map.epoch() > r->map.epoch()) continue;
    }
    impl_->Backoff(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
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
