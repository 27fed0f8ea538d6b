// SparseTable's disk tier (see table.h): spilling cold rows to a RowStore and reading them back;
// listing the keys held in both tiers.
#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/executor.h"
#include "server/table.h"

namespace pscluster {

void SparseTable::NoteRowLive(Stripe* s, uint32_t id) {
  s->live[id] = 1;
  s->referenced[id] = 1;
  s->pins[id] = 0;
}

void SparseTable::KeepReadBack(Stripe* s, uint64_t key, const std::string& row) {
  if (!s->read_back.insert_or_assign(key, row).second) return;  // Already kept: refreshed.
  s->read_back_order.push_back(key);
  while (s->read_back_order.size() > kReadBackRows) {
    // A key that left and came again meanwhile leaves a little early: only a read more.
    s->read_back.erase(s->read_back_order.front());
    s->read_back_order.pop_front();
  }
}

void SparseTable::ForgetReadBack() {
  for (int i = 0; i < kStripes; ++i) {
    absl::MutexLock l(&stripes_[i].mu);
    stripes_[i].read_back.clear();
    stripes_[i].read_back_order.clear();
  }
}

void SparseTable::NoteDiskChange(Stripe* s, uint64_t key) {
  ++s->disk_gen;
  if (!s->read_back.empty()) s->read_back.erase(key);
  if (s->readers == 0) return;  // No call holds an older read.
  if (s->disk_changes.size() >= kDiskChangesKept) {
    const size_t drop = s->disk_changes.size() / 2;
    s->disk_changes_floor = s->disk_changes[drop - 1].first;
    s->disk_changes.erase(s->disk_changes.begin(), s->disk_changes.begin() + drop);
  }
  s->disk_changes.emplace_back(s->disk_gen, key);
}

bool SparseTable::DiskChangesSince(const Stripe* s, uint64_t gen,
                                   absl::flat_hash_set<uint64_t>* keys) {
  keys->clear();
  if (s->disk_gen == gen) return true;
  if (gen < s->disk_changes_floor) return false;
  for (auto it = s->disk_changes.rbegin(); it != s->disk_changes.rend() && it->first > gen; ++it) {
    keys->insert(it->second);
  }
  return true;
}

void SparseTable::EndDiskRead(Stripe* s) {
  if (--s->readers == 0) {
    s->disk_changes.clear();
    s->disk_changes_floor = s->disk_gen;
  }
}

namespace {

Executor* DiskReadPool() {
  static Executor* const pool = new Executor(
      std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1), "disk-read");
  return pool;
}

int DiskReadHelpers() {
  static const int helpers =
      std::thread::hardware_concurrency() > 1 ? DiskReadPool()->threads() : 0;
  return helpers;
}

}  // namespace

bool SparseTable::ShareDiskReads(size_t keys) {
  const bool shared = tiered() && keys >= kSharedKeys && DiskReadHelpers() > 0 &&
                      store_ptr_.load(std::memory_order_acquire) != nullptr &&
                      rows_on_disk_.load(std::memory_order_relaxed) > 0;
  if (shared) shared_calls_.fetch_add(1, std::memory_order_relaxed);
  return shared;
}

void SparseTable::RunShared(bool shared, absl::FunctionRef<void()> body) {
  if (!shared) {
    body();
    return;
  }
  struct State {
    absl::Mutex mu;
    bool closed ABSL_GUARDED_BY(mu) = false;
    int active ABSL_GUARDED_BY(mu) = 0;
    const absl::FunctionRef<void()>* body = nullptr;  // Called only while !closed or active.
  };
  auto state = std::make_shared<State>();
  state->body = &body;
  for (int i = 0; i < DiskReadHelpers(); ++i) {
    DiskReadPool()->Post([state] {
      {
        absl::MutexLock l(&state->mu);
        if (state->closed) return;
        ++state->active;
      }
      (*state->body)();
      absl::MutexLock l(&state->mu);
      --state->active;
    });
  }
  body();
  absl::MutexLock l(&state->mu);
  state->closed = true;
  state->mu.Await(absl::Condition(
      +[](State* st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) { return st->active == 0; },
      state.get()));
}

bool SparseTable::ReadSpilled(uint64_t key, std::string* value, absl::Status* error) const {
  RowStore* store = store_ptr_.load(std::memory_order_acquire);
  if (store == nullptr || rows_on_disk_.load(std::memory_order_relaxed) == 0) return false;
  return store->Get(key, value, error);
}

std::string SparseTable::EncodeDiskRow(int64_t updates, int64_t last_step,
                                       const float* row) const {
  const size_t row_bytes = row_floats_ * sizeof(float);
  std::string v(24 + row_bytes, '\0');
  const int64_t step = has_meta() ? last_step : 0;
  const int64_t ms = has_meta() ? NowMs() : 0;
  std::memcpy(&v[0], &updates, 8);
  std::memcpy(&v[8], &step, 8);
  std::memcpy(&v[16], &ms, 8);
  std::memcpy(&v[24], row, row_bytes);
  return v;
}

absl::Status SparseTable::OpenStore() {
  absl::MutexLock l(&store_mu_);
  if (store_ != nullptr) return absl::OkStatus();
  auto store = RowStore::Open(spill_path_);
  if (!store.ok()) {
    return absl::Status(store.status().code(), absl::StrCat("table '", info_->spec.name(),
                                                            "': ", store.status().message()));
  }
  store_ = std::move(*store);
  store_ptr_.store(store_.get(), std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SparseTable::DiskLoad>> SparseTable::StartDiskLoad() {
  if (!tiered()) {
    return absl::FailedPreconditionError(
        absl::StrCat("table '", info_->spec.name(), "' has no disk tier"));
  }
  absl::Status opened = OpenStore();
  if (!opened.ok()) return opened;
  ForgetReadBack();  // Rows it adds may replace rows kept there.
  return std::unique_ptr<DiskLoad>(new DiskLoad(this, store_ptr_.load()->StartBulkLoad()));
}

absl::Status SparseTable::DiskLoad::Add(uint64_t key, int64_t updates, int64_t last_step,
                                        const float* row) {
  max_last_step_ = std::max(max_last_step_, last_step);
  uint64_t added = 0;
  absl::Status s = load_->Add(key, table_->EncodeDiskRow(updates, last_step, row), &added);
  return Added(std::move(s), added);
}

absl::Status SparseTable::DiskLoad::Finish() {
  uint64_t added = 0;
  absl::Status s = load_->Finish(&added);
  return Added(std::move(s), added);
}

absl::Status SparseTable::DiskLoad::Added(absl::Status s, uint64_t added) {
  table_->rows_on_disk_.fetch_add(added, std::memory_order_relaxed);
  if (added > 0 && table_->has_meta()) {
    int64_t seen = table_->max_step_.load(std::memory_order_relaxed);
    while (seen < max_last_step_ && !table_->max_step_.compare_exchange_weak(
                                        seen, max_last_step_, std::memory_order_relaxed)) {
    }
  }
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("table '", table_->info_->spec.name(),
                                             "': restoring rows to disk: ", s.message()));
}

std::string SparseTable::EncodeRow(Stripe* s, uint32_t id) const {
  const size_t row_bytes = row_floats_ * sizeof(float);
  std::string v(24 + row_bytes, '\0');
  const int64_t last_step = has_meta() ? s->last_step[id] : 0;
  const int64_t last_ms = has_meta() ? s->last_ms[id] : 0;
  std::memcpy(&v[0], &s->updates[id], 8);
  std::memcpy(&v[8], &last_step, 8);
  std::memcpy(&v[16], &last_ms, 8);
  std::memcpy(&v[24], const_cast<SparseTable*>(this)->RowPtr(s, id), row_bytes);
  return v;
}

uint64_t SparseTable::SpillFrom(Stripe* s, uint64_t want, bool hot_too, MemoryBudget* budget,
                                absl::Status* error) {
  const uint32_t n = static_cast<uint32_t>(s->keys.size());
  if (n == 0 || want == 0) return 0;
  // The clock: a row touched since the hand last passed gets a second chance, and so, unless
  // `hot_too`, does a row pushed lately by more than one push more often than the rows spilled
  // lately (TinyLFU's frequency against recency: a hot row untouched for a while stays, a row of
  // the long tail goes first). With `hot_too`, the hand's third turn takes any row not touched.
  std::vector<uint32_t> victims;
  const uint32_t bar = victim_pushes_x16_.load(std::memory_order_relaxed) + 16;
  const uint32_t turns = hot_too ? 3 : 2;
  for (uint32_t looked = 0; looked < turns * n && victims.size() < want; ++looked) {
    const uint32_t id = s->hand;
    s->hand = (s->hand + 1) % n;
    if (!s->live[id] || s->pins[id] > 0) continue;
    if (s->referenced[id]) {
      s->referenced[id] = 0;
      continue;
    }
    if (looked < 2 * n && pushes_->Estimate(s->keys[id]) * 16 > bar) continue;
    s->live[id] = 0;  // Taken: not looked at again in this sweep.
    victims.push_back(id);
  }
  if (victims.empty()) return 0;
  {
    uint64_t sum = 0;
    for (uint32_t id : victims) sum += pushes_->Estimate(s->keys[id]);
    const uint32_t mean_x16 = static_cast<uint32_t>(16 * sum / victims.size());
    // A moving average over spills: the admission bar of rows pushed while on disk.
    uint32_t old = victim_pushes_x16_.load(std::memory_order_relaxed);
    while (!victim_pushes_x16_.compare_exchange_weak(old, (7 * old + mean_x16) / 8,
                                                     std::memory_order_relaxed)) {
    }
  }
  std::vector<std::pair<uint64_t, std::string>> rows;
  rows.reserve(victims.size());
  for (uint32_t id : victims) rows.emplace_back(s->keys[id], EncodeRow(s, id));
  absl::Status put = store_ptr_.load()->PutAll(rows);
  if (!put.ok()) {
    for (uint32_t id : victims) s->live[id] = 1;
    *error = absl::Status(put.code(), absl::StrCat("table '", info_->spec.name(),
                                                   "': spilling rows: ", put.message()));
    return 0;
  }
  for (uint32_t id : victims) {
    NoteDiskChange(s, s->keys[id]);
    s->index.erase(s->keys[id]);
    s->free_ids.push_back(id);
  }
  budget->Release(victims.size() * row_floats_ * sizeof(float));
  rows_on_disk_.fetch_add(victims.size(), std::memory_order_relaxed);
  spills_.fetch_add(victims.size(), std::memory_order_relaxed);
  return victims.size();
}

absl::Status SparseTable::Reserve(uint64_t bytes, MemoryBudget* budget, uint64_t rows_wanted) {
  const uint64_t row_bytes = row_floats_ * sizeof(float);
  auto short_of_memory = [&](absl::string_view more) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "table '", info_->spec.name(), "': no memory for ", rows_wanted, " rows (", bytes,
        " bytes); ", budget->used(), " bytes held of the --memory_bytes limit ", budget->limit(),
        more, "; nothing was applied"));
  };
  if (budget->TryReserve(bytes)) return absl::OkStatus();
  if (!tiered()) return short_of_memory("");
  absl::Status opened = OpenStore();
  if (!opened.ok()) return opened;
  // Spill what is needed and a little more (up to 1/32 of the rows in memory, at most 256: one
  // disk write for several calls), a few stripes at a time, starting where the last spill
  // stopped so that every stripe's clock turns. The first two rounds over the stripes spare the
  // hot rows (a stripe short of colder ones leaves its share to the stripes after it); the
  // last two do not.
  const uint64_t in_memory = rows() - rows_on_disk_.load(std::memory_order_relaxed);
  const uint64_t batch = std::max<uint64_t>(std::min<uint64_t>(256, in_memory / 32),
                                            (bytes + row_bytes - 1) / row_bytes);
  // Rounds go on while they free rows: other calls at the same time may take what a round
  // freed before this one does (up to 64 rounds).
  for (int attempt = 0; attempt < 64; ++attempt) {
    uint64_t freed = 0;
    for (int k = 0; k < kStripes && freed < batch; ++k) {
      Stripe* st = &stripes_[spill_cursor_.fetch_add(1, std::memory_order_relaxed) % kStripes];
      absl::Status error;
      absl::MutexLock l(&st->mu);
      freed += SpillFrom(st, (batch - freed + kStripes - 1 - k) / (kStripes - k) + 1,
                         /*hot_too=*/attempt >= 2, budget, &error);
      if (!error.ok()) return error;
    }
    if (budget->TryReserve(bytes)) return absl::OkStatus();
    if (freed == 0 && attempt >= 2) break;
  }
  return short_of_memory(absl::StrCat(
      " even with every other row of the table spilled to ", spill_path_,
      " (the rows of one push must fit in memory together: raise --memory_bytes)"));
}

bool SparseTable::ListKeys(uint64_t start, size_t limit, const std::vector<bool>& held,
                           std::vector<uint64_t>* keys) {
  keys->clear();
  if (limit == 0) return false;
  const int64_t step = max_step_.load(std::memory_order_relaxed);
  const int64_t now_ms = policy_.expires() ? NowMs() : 0;
  auto wanted = [&](uint64_t key, int64_t last_step, int64_t last_ms) {
    if (key < start) return false;
    const uint32_t shard = ShardOf(key);
    if (shard >= held.size() || !held[shard]) return false;
    return !(policy_.expires() && policy_.Expired(last_step, last_ms, step, now_ms));
  };
  // One more than the page: whether more remain. A key lives in one tier only.
  const size_t want = limit + 1;
  for (int s = 0; s < kStripes; ++s) {
    Stripe* st = &stripes_[s];
    absl::MutexLock l(&st->mu);
    for (const auto& [key, id] : st->index) {
      if (tiered() && !st->live[id]) continue;
      if (wanted(key, has_meta() ? st->last_step[id] : 0, has_meta() ? st->last_ms[id] : 0)) {
        keys->push_back(key);
      }
    }
    // Keep the page's smallest keys only, so memory follows the page, not the table.
    if (keys->size() > 2 * want) {
      std::nth_element(keys->begin(), keys->begin() + want, keys->end());
      keys->resize(want);
    }
  }
  RowStore* store = store_ptr_.load(std::memory_order_acquire);
  if (store != nullptr && rows_on_disk_.load(std::memory_order_relaxed) > 0) {
    size_t on_disk = 0;  // Ascending: the first `want` wanted ones are all the page can use.
    store->ForEachFrom(start, [&](uint64_t key, absl::string_view v) {
      if (v.size() < 24) return true;
      int64_t last_step, last_ms;
      std::memcpy(&last_step, v.data() + 8, 8);
      std::memcpy(&last_ms, v.data() + 16, 8);
      if (!wanted(key, last_step, last_ms)) return true;
      keys->push_back(key);
      return ++on_disk < want;
    });
  }
  std::sort(keys->begin(), keys->end());
  keys->erase(std::unique(keys->begin(), keys->end()), keys->end());
  const bool more = keys->size() > limit;
  if (more) keys->resize(limit);
  return more;
}

}  // namespace pscluster
