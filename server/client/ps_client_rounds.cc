// PsClient's rounds: a call's pushes and pulls planned as chunks per server (dense blocks and
// sparse rows routed by the shard map, payloads borrowed from the caller or encoded to
// fp16/bf16), then sent on each server's connection and their replies awaited.
#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "server/client/ps_client_impl.h"

namespace pscluster {

using client_detail::ClientTable;
using client_detail::FailedConn;
using client_detail::Connection;
using client_detail::Routing;
using client_detail::Planned;
using client_detail::CallScratch;
using client_detail::KeyRoute;
using client_detail::ReleaseRoundSlice;

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
                                  const PushSources* src, const CompressedPushes& compressed,
                                  const PullTargets* dst, int64_t pull_clock, bool end_of_step,
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
  // Pull compression: block `b` of dense table `t` is pulled against this client's copy of it,
  // when this call has the table's mirror to itself (else it is pulled whole).
  auto mirrored = [&](const ClientTable& t) {
    if (t.mirror == nullptr || dst == nullptr || dst->exact) return false;
    for (const auto& m : scratch->mirrors) {
      if (m == t.mirror) return true;
    }
    if (t.mirror->busy.exchange(true)) return false;
    scratch->mirrors.push_back(t.mirror);
    return true;
  };
  auto view_dest = [&](Planned* p, const ClientTable& t, uint64_t b) {
    if (!mirrored(t)) return;
    const uint64_t view = t.mirror->views[b];
    p->header.set_pull_view(view != 0 ? view : kPullViewStart);
    p->dest.mirror = t.mirror->values.data() + b * t.block_elems;
    p->dest.view = &t.mirror->views[b];
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
      auto packed = compressed.find(ti);
      for (uint64_t b = 0; b < t->num_blocks; ++b) {
        const uint64_t first = b * t->block_elems;
        const uint64_t n = std::min(t->block_elems, t->elems - first);
        Planned p;
        p.header = header(*t);
        p.header.mutable_slice()->set_block(b);
        if (packed != compressed.end()) {
          // Top-k or int8 (error_feedback.h): the values are copied, the call's blocks are
          // reused by its retries.
          const client_detail::CompressedBlock& cb = packed->second[b];
          p.header.set_dtype(cb.dtype);
          p.header.set_indices(cb.indices);
          if (!cb.scales.empty()) {
            p.header.set_scales(cb.scales);
            p.header.set_scale_group(kInt8ScaleGroup);
          }
          p.owned_bytes = cb.values.size();
          p.owned = pool->Acquire(std::max<size_t>(p.owned_bytes, 1));
          std::memcpy(p.owned.data, cb.values.data(), p.owned_bytes);
        } else if (t->transport == v1::DT_FLOAT32) {
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
          view_dest(&p, *t, b);
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
        view_dest(&p, *t, b);
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
                                     const PushSources* src,
                                     const CompressedPushes& compressed, const PullTargets* dst,
                                     int64_t pull_clock, bool end_of_step, absl::Time deadline,
                                     int64_t* min_clock) {
  if (cancelled.load()) return CancelledStatus();
  std::vector<std::vector<Planned>> plans;
  CallScratch scratch;
  absl::Time t0 = absl::Now();
  absl::Status st =
      Plan(r, step, seq, src, compressed, dst, pull_clock, end_of_step, &plans, &scratch);
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
  auto any_part_failed = [&sent] {
    for (const auto& s : sent) {
      absl::Status st;
      if (s.round->Finished(&st) && !st.ok()) return true;
    }
    return false;
  };
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
    // gRPC streams deliver on their own threads: wait for their parts in turn, a slice at a
    // time, so that one part's failure is seen while another is still outstanding.
    if (conns.size() < sent.size()) {
      while (!any_part_failed() && absl::Now() < deadline) {
        bool all = true;
        for (auto& s : sent) {
          if (dynamic_cast<TcpConn*>(s.stream.get()) != nullptr) continue;
          if (!s.round->AwaitFinished(std::min(deadline, absl::Now() + absl::Milliseconds(20)))) {
            all = false;
            break;
          }
        }
        if (all) break;
      }
    }
  }
  for (auto& s : sent) {
    absl::Status rs;
    if (sent.size() > 1 && !s.round->Finished() && any_part_failed()) {
      // Another server's part failed (a stale map after a shard move, say): the call is retried
      // as a whole, so this part is given up now instead of waited for. It may be parked at a
      // gate waiting for a push that only the retry brings; the retry's pushes are deduplicated
      // by their sequence number wherever this part's were applied.
      s.round->Fail(absl::AbortedError(absl::StrCat(
          s.peer, ": request ", s.round->request_id(), " given up: another server's part failed")));
      s.stream->Forget(s.round->request_id());
      s.stream->Cancel();
      (void)s.round->Wait(absl::InfiniteFuture());  // Returns once no copy into it is running.
      continue;  // The failed part gives the call's status.
    }
    rs = s.stream->Wait(s.round, deadline);
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

}  // namespace pscluster
