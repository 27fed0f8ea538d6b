#include "server/pull_views.h"

#include <cstring>
#include <random>

#include "common/dtype.h"
#include "common/grad_compress.h"

namespace pscluster {

PullViews::PullViews(MemoryBudget* budget) : budget_(budget) {
  // Ids start at a random point, so that an id a worker got from another server process (one
  // that held the shard before, or this server before a restart) is not taken for one of these.
  std::random_device rd;
  next_id_.store((uint64_t{rd()} << 32) ^ rd());
}

PullViews::~PullViews() {
  absl::MutexLock l(&mu_);
  budget_->Release(bytes_);
}

uint64_t PullViews::NextId() {
  uint64_t id;
  do {
    id = next_id_.fetch_add(1, std::memory_order_relaxed) + 1;
  } while (id == 0 || id == kPullViewStart);
  return id;
}

PullViews::Reply PullViews::Encode(uint32_t worker, uint32_t table, uint64_t block, uint64_t held,
                                   const float* w, uint64_t n, v1::DataType dtype, float ratio) {
  const size_t es = DTypeSize(dtype);
  Reply reply;
  std::shared_ptr<View> view;
  {
    absl::MutexLock l(&mu_);
    auto it = views_.find(Key{worker, table, block});
    if (it != views_.end()) view = it->second;
  }
  if (view != nullptr && held != kPullViewStart) {
    absl::MutexLock v(&view->mu);
    if (view->id == held && view->values.size() == n) {
      // The weights as the worker would decode them (fp16/bf16 rounding included): what it can
      // be sent. What moved most from its view goes; the rest stays owed.
      thread_local std::vector<float> sendable, moved;
      thread_local std::string encoded;
      const float* rw = w;
      if (dtype != v1::DT_FLOAT32) {
        encoded.resize(n * es);
        sendable.resize(n);
        EncodeFloats(w, n, dtype, encoded.data());
        DecodeFloats(encoded.data(), n, dtype, sendable.data());
        rw = sendable.data();
      }
      moved.resize(n);
      for (uint64_t i = 0; i < n; ++i) moved[i] = rw[i] - view->values[i];
      const std::vector<uint32_t> idx = SelectTopK(moved.data(), n, TopKCount(n, ratio));
      reply.values.resize(idx.size() * es);
      for (size_t i = 0; i < idx.size(); ++i) {
        const char* from = dtype != v1::DT_FLOAT32 ? encoded.data() + idx[i] * es
                                                   : reinterpret_cast<const char*>(w + idx[i]);
        std::memcpy(reply.values.data() + i * es, from, es);
        view->values[idx[i]] = rw[idx[i]];
      }
      reply.indices.assign(reinterpret_cast<const char*>(idx.data()), idx.size() * 4);
      view->id = NextId();
      reply.view = view->id;
      return reply;
    }
  }
  // The whole block; the view starts again from it (when asked for, and when it fits).
  reply.values.resize(n * es);
  EncodeFloats(w, n, dtype, reply.values.data());
  if (held == 0) return reply;  // A plain pull: no view wanted.
  if (view == nullptr) {
    if (!budget_->TryReserve(n * sizeof(float))) return reply;
    absl::MutexLock l(&mu_);
    auto& slot = views_[Key{worker, table, block}];
    if (slot == nullptr) {
      slot = std::make_shared<View>(n);
      bytes_ += slot->reserved;
    } else {
      budget_->Release(n * sizeof(float));  // Another pull of the same block made it first.
    }
    view = slot;
  }
  absl::MutexLock v(&view->mu);
  if (view->values.size() != n) {
    // A view of another size (never, for a block of a table declared once): start afresh.
    view->values.assign(n, 0.f);
  }
  DecodeFloats(reply.values.data(), n, dtype, view->values.data());
  view->id = NextId();
  reply.view = view->id;
  return reply;
}

void PullViews::DropUnless(const std::function<bool(uint32_t table, uint64_t block)>& keep) {
  DropIf([&](const Key& k) { return !keep(std::get<1>(k), std::get<2>(k)); });
}

void PullViews::DropWorker(uint32_t worker) {
  DropIf([worker](const Key& k) { return std::get<0>(k) == worker; });
}

void PullViews::DropIf(const std::function<bool(const Key&)>& drop) {
  absl::MutexLock l(&mu_);
  for (auto it = views_.begin(); it != views_.end();) {
    if (!drop(it->first)) {
      ++it;
      continue;
    }
    bytes_ -= it->second->reserved;
    budget_->Release(it->second->reserved);
    views_.erase(it++);
  }
}

uint64_t PullViews::bytes() const {
  absl::MutexLock l(&mu_);
  return bytes_;
}

}  // namespace pscluster
