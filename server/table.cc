#include "server/table.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/sharding.h"

namespace pscluster {
namespace {

constexpr size_t kScratchFloats = 4096;  // 16 KiB: stays in L1 while the optimizer runs.
constexpr size_t kPageBytes = 64 << 10;

}  // namespace

TableInfo::TableInfo(const v1::TableSpec& s, const OptimizerParams& o, uint32_t shards)
    : spec(s), hash(TableHash(s.name())), optimizer(o), init(s), num_shards(shards) {
  if (dense()) {
    elems = 1;
    for (uint64_t d : spec.shape().dims()) elems *= d;
    if (spec.block_elems() == 0) spec.set_block_elems(kDefaultBlockElems);
  } else {
    width = spec.row_width();
  }
}

namespace {

std::shared_ptr<float> NewWeights(size_t n) {
  size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  return std::shared_ptr<float>(static_cast<float*>(std::aligned_alloc(64, bytes ? bytes : 64)),
                                [](float* p) { std::free(p); });
}

}  // namespace

namespace {
std::atomic<uint64_t> copies_on_write_total{0};
}  // namespace

uint64_t DenseCopiesOnWrite() { return copies_on_write_total.load(std::memory_order_relaxed); }

DenseBlock::DenseBlock(size_t n, int num_slots) : elems(n), slots(num_slots), steps(n) {}

float* DenseBlock::MutableWeights() {
  if (weights.use_count() > 1) {
    std::shared_ptr<float> fresh = NewWeights(elems);
    std::memcpy(fresh.get(), weights.get(), elems * sizeof(float));
    weights = std::move(fresh);
    ++copies_on_write;
    copies_on_write_total.fetch_add(1, std::memory_order_relaxed);
  }
  return weights.get();
}

// ---------------------------------------------------------------- dense

DenseTable::DenseTable(const TableInfo* info)
    : info_(info),
      block_elems_(info->spec.block_elems()),
      num_blocks_(NumBlocks(info->elems, info->spec.block_elems())),
      blocks_(num_blocks_) {}

DenseTable::~DenseTable() = default;

uint64_t DenseTable::BlockLen(uint64_t b) const {
  uint64_t first = b * block_elems_;
  return std::min<uint64_t>(block_elems_, info_->elems - first);
}

uint32_t DenseTable::ShardOf(uint64_t b) const {
  return ShardOfBlock(info_->hash, b, info_->num_shards);
}

absl::Status DenseTable::SetHeldShards(const std::vector<bool>& held, MemoryBudget* budget) {
  const int slots = info_->optimizer.num_slots();
  const size_t fpe = info_->floats_per_elem();
  uint64_t need = 0;
  for (uint64_t b = 0; b < num_blocks_; ++b) {
    if (held[ShardOf(b)] && blocks_[b] == nullptr) need += BlockLen(b) * fpe * sizeof(float);
  }
  if (need > 0 && !budget->TryReserve(need)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "table '", info_->spec.name(), "' needs ", need, " more bytes; this server holds ",
        budget->used(), " of its --memory_bytes limit ", budget->limit()));
  }
  for (uint64_t b = 0; b < num_blocks_; ++b) {
    bool want = held[ShardOf(b)];
    if (want && blocks_[b] == nullptr) {
      auto blk = std::make_unique<DenseBlock>(BlockLen(b), slots);
      absl::MutexLock l(&blk->mu);
      blk->weights = NewWeights(blk->elems);
      blk->slot_data.reset(new float[blk->elems * (fpe - 1) + 1]);
      info_->init.FillDense(b * block_elems_, blk->elems, blk->weights.get());
      InitSlots(info_->optimizer, blk->slot_data.get(), blk->elems);
      blocks_[b] = std::move(blk);
    } else if (!want && blocks_[b] != nullptr) {
      budget->Release(blocks_[b]->bytes());
      blocks_[b].reset();
    }
  }
  return absl::OkStatus();
}

void DenseTable::Apply(DenseBlock* b, uint64_t offset, size_t n, GradientFn grad,
                       int64_t step) {
  const OptimizerParams opt = AtStep(info_->optimizer, step);
  float scratch[kScratchFloats];
  absl::MutexLock l(&b->mu);
  float* w = b->MutableWeights();
  float* s0 = b->slots >= 1 ? b->slot_data.get() : nullptr;
  float* s1 = b->slots >= 2 ? b->slot_data.get() + b->elems : nullptr;
  b->steps.Advance(offset, n, [&](uint64_t first, uint64_t count, int64_t t) {
    for (size_t done = 0; done < count;) {
      size_t k = std::min<size_t>(kScratchFloats, count - done);
      const size_t rel = first - offset + done;  // Relative to the start of the update.
      grad(rel, k, scratch);
      const size_t at = first + done;
      ApplyUpdate(opt, t, k, scratch, w + at, s0 ? s0 + at : nullptr, s1 ? s1 + at : nullptr);
      done += k;
    }
  });
}

void DenseTable::ApplyPayload(DenseBlock* b, uint64_t offset, size_t n, const Payload& grad,
                              v1::DataType dtype, int64_t step) {
  const OptimizerParams opt = AtStep(info_->optimizer, step);
  float scratch[kScratchFloats];
  absl::MutexLock l(&b->mu);
  float* w = b->MutableWeights();
  float* s0 = b->slots >= 1 ? b->slot_data.get() : nullptr;
  float* s1 = b->slots >= 2 ? b->slot_data.get() + b->elems : nullptr;
  b->steps.Advance(offset, n, [&](uint64_t first, uint64_t count, int64_t t) {
    grad.ForEachFloatRun(dtype, first - offset, count, scratch, kScratchFloats,
                         [&](size_t i, const float* g, size_t k) {
                           const size_t at = first + i;
                           ApplyUpdate(opt, t, k, g, w + at, s0 ? s0 + at : nullptr,
                                       s1 ? s1 + at : nullptr);
                         });
  });
}

void DenseTable::Read(DenseBlock* b, uint64_t offset, size_t n, v1::DataType dtype, char* out) {
  absl::MutexLock l(&b->mu);
  EncodeFloats(b->weights.get() + offset, n, dtype, out);
}

LentBytes DenseTable::Lend(DenseBlock* b, uint64_t offset, size_t n) {
  absl::MutexLock l(&b->mu);
  LentBytes lent;
  lent.owner = b->weights;
  lent.data = reinterpret_cast<const char*>(b->weights.get() + offset);
  lent.size = n * sizeof(float);
  return lent;
}

uint64_t DenseTable::blocks_held() const {
  uint64_t n = 0;
  for (const auto& b : blocks_) n += b != nullptr;
  return n;
}

uint64_t DenseTable::elements_held() const {
  uint64_t n = 0;
  for (const auto& b : blocks_) n += b ? b->elems : 0;
  return n;
}

uint64_t DenseTable::bytes_held() const {
  uint64_t n = 0;
  for (const auto& b : blocks_) n += b ? b->bytes() : 0;
  return n;
}

void DenseTable::Clear(MemoryBudget* budget) {
  for (auto& b : blocks_) {
    if (b) budget->Release(b->bytes());
    b.reset();
  }
}

// ---------------------------------------------------------------- sparse

SparseTable::SparseTable(const TableInfo* info, const Clock* clock, std::string spill_path)
    : info_(info),
      clock_(clock),
      spill_path_(std::move(spill_path)),
      policy_(info->spec.embedding(), info->hash, info->spec.init().seed()),
      row_floats_(info->width * info->floats_per_elem()),
      rows_per_page_(std::max<size_t>(1, kPageBytes / (row_floats_ * sizeof(float)))),
      stripes_(new Stripe[kStripes]) {
  if (tiered()) pushes_ = std::make_unique<RecentTouches>();
}

SparseTable::~SparseTable() = default;

uint32_t SparseTable::ShardOf(uint64_t key) const {
  return ShardOfKey(info_->hash, key, info_->num_shards);
}

int SparseTable::StripeOf(uint64_t key) {
  return static_cast<int>(Mix64(key ^ 0xa0761d6478bd642fULL) >> 58);  // Top 6 bits: 64 stripes.
}

float* SparseTable::RowPtr(Stripe* s, uint32_t id) {
  return s->pages[id / rows_per_page_].get() + (id % rows_per_page_) * row_floats_;
}

float* SparseTable::FindOrCreate(Stripe* s, uint64_t key, MemoryBudget* budget,
                                 uint64_t* reserved, int64_t** updates, bool* loaded,
                                 absl::Status* error, const std::string* known) {
  if (loaded != nullptr) *loaded = false;
  auto it = s->index.find(key);
  if (it != s->index.end()) {
    if (tiered()) s->referenced[it->second] = 1;
    *updates = &s->updates[it->second];
    return RowPtr(s, it->second);
  }
  const uint64_t row_bytes = row_floats_ * sizeof(float);
  if (*reserved >= row_bytes) {
    *reserved -= row_bytes;
  } else if (!budget->TryReserve(row_bytes)) {
    return nullptr;
  }
  std::string spilled;
  if (tiered()) {
    absl::Status read_error;
    const bool on_disk = known != nullptr ? (spilled = *known, !spilled.empty())
                                          : ReadSpilled(key, &spilled, &read_error);
    if (on_disk) {
      if (spilled.size() != 24 + row_bytes) {
        read_error = absl::DataLossError(absl::StrCat(
            "table '", info_->spec.name(), "': disk tier ", spill_path_, " holds ",
            spilled.size(), " bytes for row ", key, ", expected ", 24 + row_bytes));
      } else {
        read_error = store_ptr_.load()->Delete(key);
        if (read_error.ok()) NoteDiskChange(s, key);
      }
    }
    if (!read_error.ok()) {
      *reserved += row_bytes;
      if (error != nullptr) *error = read_error;
      return nullptr;
    }
  }
  uint32_t id;
  if (!s->free_ids.empty()) {
    id = s->free_ids.back();
    s->free_ids.pop_back();
    s->keys[id] = key;
    s->updates[id] = 0;
    if (has_meta()) {
      s->last_step[id] = 0;
      s->last_ms[id] = 0;
    }
  } else {
    id = static_cast<uint32_t>(s->keys.size());
    if (id / rows_per_page_ >= s->pages.size()) {
      s->pages.emplace_back(new float[rows_per_page_ * row_floats_]);
    }
    s->keys.push_back(key);
    s->updates.push_back(0);
    if (has_meta()) {
      s->last_step.push_back(0);
      s->last_ms.push_back(0);
    }
    if (tiered()) {
      s->live.push_back(0);
      s->referenced.push_back(0);
      s->pins.push_back(0);
    }
  }
  s->index.emplace(key, id);
  if (tiered()) NoteRowLive(s, id);
  float* row = RowPtr(s, id);
  if (!spilled.empty()) {
    std::memcpy(&s->updates[id], spilled.data(), 8);
    std::memcpy(&s->last_step[id], spilled.data() + 8, 8);
    std::memcpy(&s->last_ms[id], spilled.data() + 16, 8);
    std::memcpy(row, spilled.data() + 24, row_bytes);
    rows_on_disk_.fetch_sub(1, std::memory_order_relaxed);
    if (loaded != nullptr) *loaded = true;
  } else {
    info_->init.FillRow(key, info_->width, row);
    InitSlots(info_->optimizer, row + info_->width, info_->width);
  }
  *updates = &s->updates[id];
  return row;
}

void SparseTable::SortByStripe(absl::Span<const uint64_t> keys, int* count,
                               std::vector<uint32_t>* order) {
  // Counting sort of the request positions by stripe, so each stripe is locked once.
  std::fill(count, count + kStripes + 1, 0);
  std::vector<uint8_t> stripe_of(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    stripe_of[i] = static_cast<uint8_t>(StripeOf(keys[i]));
    ++count[stripe_of[i] + 1];
  }
  for (int s = 0; s < kStripes; ++s) count[s + 1] += count[s];
  order->resize(keys.size());
  int pos[kStripes];
  std::copy(count, count + kStripes, pos);
  for (size_t i = 0; i < keys.size(); ++i) (*order)[pos[stripe_of[i]]++] = static_cast<uint32_t>(i);
}

absl::Status SparseTable::VisitRows(absl::Span<const uint64_t> keys, MemoryBudget* budget,
                                    absl::FunctionRef<void(size_t, float*, int64_t*)> f) {
  int count[kStripes + 1];
  std::vector<uint32_t> order;
  SortByStripe(keys, count, &order);
  // Phase 1: count the rows to create (each key once) and take their memory, all or nothing.
  // Rows are only ever removed with exclusive access to the table, so the count can only fall
  // before phase 2 (another call creating some of the same rows); the rest is given back.
  const uint64_t row_bytes = row_floats_ * sizeof(float);
  uint64_t absent = 0;
  {
    absl::flat_hash_set<uint64_t> counted;
    for (int s = 0; s < kStripes; ++s) {
      if (count[s] == count[s + 1]) continue;
      Stripe* st = &stripes_[s];
      absl::MutexLock l(&st->mu);
      for (int j = count[s]; j < count[s + 1]; ++j) {
        const uint64_t key = keys[order[j]];
        if (!st->index.contains(key) && counted.insert(key).second) ++absent;
      }
    }
  }
  uint64_t reserved = absent * row_bytes;
  if (reserved > 0 && !budget->TryReserve(reserved)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "table '", info_->spec.name(), "': no memory for ", absent, " new rows (", reserved,
        " bytes); ", budget->used(), " bytes held of the --memory_bytes limit ", budget->limit(),
        "; nothing was applied"));
  }
  // Phase 2: visit, creating rows from the reserved memory.
  for (int s = 0; s < kStripes; ++s) {
    if (count[s] == count[s + 1]) continue;
    Stripe* st = &stripes_[s];
    absl::MutexLock l(&st->mu);
    for (int j = count[s]; j < count[s + 1]; ++j) {
      size_t i = order[j];
      int64_t* updates = nullptr;
      float* row = FindOrCreate(st, keys[i], budget, &reserved, &updates);
      if (row == nullptr) {  // Not reached: phase 1 reserved every new row.
        budget->Release(reserved);
        return absl::InternalError(absl::StrCat("table '", info_->spec.name(),
                                                "': row memory reserved for key ", keys[i],
                                                " was gone"));
      }
      f(i, row, updates);
    }
  }
  budget->Release(reserved);
  return absl::OkStatus();
}

absl::Status SparseTable::Apply(absl::Span<const uint64_t> keys, GradientFn grad,
                                MemoryBudget* budget, int64_t step, Decisions* decisions) {
  if (policy_.active() || tiered()) return ApplyWithPolicy(keys, grad, budget, step, decisions);
  const size_t width = info_->width;
  const OptimizerParams opt = AtStep(info_->optimizer, step);
  std::vector<float> g(width);
  return VisitRows(keys, budget, [&](size_t i, float* row, int64_t* updates) {
    grad(i * width, width, g.data());
    ++*updates;
    ApplyUpdate(opt, *updates, width, g.data(), row, opt.num_slots() >= 1 ? row + width : nullptr,
                opt.num_slots() >= 2 ? row + 2 * width : nullptr);
  });
}

void SparseTable::Read(absl::Span<const uint64_t> keys, v1::DataType dtype, char* out) {
  const size_t width = info_->width;
  const size_t row_bytes = width * DTypeSize(dtype);
  const int64_t step = max_step_.load(std::memory_order_relaxed);
  const int64_t now_ms = policy_.expires() ? NowMs() : 0;
  int count[kStripes + 1];
  std::vector<uint32_t> order;
  SortByStripe(keys, count, &order);
  RowStore* store = tiered() ? store_ptr_.load(std::memory_order_acquire) : nullptr;
  std::atomic<int> next_stripe{0};
  std::atomic<uint64_t> without_row{0}, ram_hits{0}, disk_reads{0};
  // With a disk tier, the keys of a stripe that are not in memory are read from disk together,
  // in one batched lookup, still under the stripe's lock; with many keys, the stripes are shared
  // out among threads (RunShared), each reading its own.
  RunShared(ShareDiskReads(keys.size()), [&] {
    std::vector<float> initial(width);
    uint64_t my_without_row = 0, my_ram_hits = 0, my_disk_reads = 0;
    std::vector<size_t> missed;
    std::vector<uint64_t> missed_keys;
    std::vector<std::string> spilled;
    auto initial_value = [&](size_t i) {
      info_->init.FillRow(keys[i], width, initial.data());
      EncodeFloats(initial.data(), width, dtype, out + i * row_bytes);
      ++my_without_row;
    };
    for (int s; (s = next_stripe.fetch_add(1, std::memory_order_relaxed)) < kStripes;) {
      if (count[s] == count[s + 1]) continue;
      Stripe* st = &stripes_[s];
      absl::MutexLock l(&st->mu);
      missed.clear();
      for (int j = count[s]; j < count[s + 1]; ++j) {
        const size_t i = order[j];
        auto it = st->index.find(keys[i]);
        if (it != st->index.end()) {
          if (tiered()) {
            st->referenced[it->second] = 1;
            ++my_ram_hits;
          }
          if (!(policy_.expires() && policy_.Expired(st->last_step[it->second],
                                                     st->last_ms[it->second], step, now_ms))) {
            EncodeFloats(RowPtr(st, it->second), width, dtype, out + i * row_bytes);
            continue;
          }
        } else if (store != nullptr && rows_on_disk_.load(std::memory_order_relaxed) > 0) {
          missed.push_back(i);
          continue;
        }
        initial_value(i);
      }
      if (missed.empty()) continue;
      missed_keys.resize(missed.size());
      for (size_t m = 0; m < missed.size(); ++m) missed_keys[m] = keys[missed[m]];
      // An error reading counts as no row (as a single Get's did): the initializer's values.
      (void)store->GetMany(missed_keys, &spilled);
      for (size_t m = 0; m < missed.size(); ++m) {
        const size_t i = missed[m];
        const std::string& v = spilled[m];
        if (v.size() == 24 + width * info_->floats_per_elem() * sizeof(float)) {
          ++my_disk_reads;
          KeepReadBack(st, keys[i], v);
          int64_t last_step, last_ms;
          std::memcpy(&last_step, v.data() + 8, 8);
          std::memcpy(&last_ms, v.data() + 16, 8);
          if (!(policy_.expires() && policy_.Expired(last_step, last_ms, step, now_ms))) {
            std::memcpy(initial.data(), v.data() + 24, width * sizeof(float));
            EncodeFloats(initial.data(), width, dtype, out + i * row_bytes);
            continue;
          }
        }
        initial_value(i);
      }
    }
    without_row.fetch_add(my_without_row, std::memory_order_relaxed);
    ram_hits.fetch_add(my_ram_hits, std::memory_order_relaxed);
    disk_reads.fetch_add(my_disk_reads, std::memory_order_relaxed);
  });
  if (without_row > 0) reads_without_row_.fetch_add(without_row, std::memory_order_relaxed);
  if (ram_hits > 0) ram_hits_.fetch_add(ram_hits, std::memory_order_relaxed);
  if (disk_reads > 0) disk_reads_.fetch_add(disk_reads, std::memory_order_relaxed);
}

uint64_t SparseTable::DropIf(absl::FunctionRef<bool(uint64_t, int64_t, int64_t)> drop,
                             MemoryBudget* budget, bool include_disk) {
  const bool meta = has_meta();
  const bool tier = tiered();
  uint64_t dropped = 0;
  for (int s = 0; s < kStripes; ++s) {
    Stripe* st = &stripes_[s];
    absl::MutexLock l(&st->mu);
    auto drops = [&](uint32_t id) {
      return (!tier || (st->live[id] && st->pins[id] == 0)) &&
             drop(st->keys[id], meta ? st->last_step[id] : 0, meta ? st->last_ms[id] : 0);
    };
    bool any = false;
    for (uint32_t id = 0; id < st->keys.size(); ++id) {
      if (drops(id)) {
        any = true;
        break;
      }
    }
    if (!any) continue;
    Stripe fresh;
    absl::MutexLock lf(&fresh.mu);
    for (uint32_t id = 0; id < st->keys.size(); ++id) {
      uint64_t key = st->keys[id];
      if (tier && !st->live[id]) continue;  // Moved to disk; its id is not carried over.
      if (drops(id)) {
        budget->Release(row_floats_ * sizeof(float));
        ++dropped;
        continue;
      }
      if (meta) {
        fresh.last_step.push_back(st->last_step[id]);
        fresh.last_ms.push_back(st->last_ms[id]);
      }
      if (tier) {
        fresh.live.push_back(1);
        fresh.referenced.push_back(st->referenced[id]);
        fresh.pins.push_back(st->pins[id]);
      }
      uint32_t nid = static_cast<uint32_t>(fresh.keys.size());
      if (nid / rows_per_page_ >= fresh.pages.size()) {
        fresh.pages.emplace_back(new float[rows_per_page_ * row_floats_]);
      }
      fresh.index.emplace(key, nid);
      fresh.keys.push_back(key);
      fresh.updates.push_back(st->updates[id]);
      std::memcpy(RowPtr(&fresh, nid), RowPtr(st, id), row_floats_ * sizeof(float));
    }
    st->index.swap(fresh.index);
    st->pages.swap(fresh.pages);
    st->keys.swap(fresh.keys);
    st->updates.swap(fresh.updates);
    st->last_step.swap(fresh.last_step);
    st->last_ms.swap(fresh.last_ms);
    st->live.swap(fresh.live);
    st->referenced.swap(fresh.referenced);
    st->pins.swap(fresh.pins);
    st->free_ids.clear();
    st->hand = 0;
  }
  if (include_disk && store_ptr_.load() != nullptr && rows_on_disk_.load() > 0) {
    ForgetReadBack();
    RowStore* store = store_ptr_.load();
    std::vector<uint64_t> gone;
    store->ForEach([&](uint64_t key, absl::string_view v) {
      int64_t last_step = 0, last_ms = 0;
      if (v.size() >= 24) {
        std::memcpy(&last_step, v.data() + 8, 8);
        std::memcpy(&last_ms, v.data() + 16, 8);
      }
      if (drop(key, last_step, last_ms)) gone.push_back(key);
    });
    for (uint64_t key : gone) {
      absl::Status s = store->Delete(key);
      if (!s.ok()) {
        Logger("server")->error("table '{}': {}", info_->spec.name(), s.ToString());
        continue;
      }
      rows_on_disk_.fetch_sub(1, std::memory_order_relaxed);
      ++dropped;
    }
  }
  return dropped;
}

void SparseTable::DropUnheld(const std::vector<bool>& held, MemoryBudget* budget) {
  DropIf([&](uint64_t key, int64_t, int64_t) { return !held[ShardOf(key)]; }, budget);
}

void SparseTable::DropShards(const std::vector<bool>& shards, MemoryBudget* budget) {
  DropIf([&](uint64_t key, int64_t, int64_t) { return static_cast<bool>(shards[ShardOf(key)]); },
         budget);
}

void SparseTable::ForEachRowSorted(
    absl::FunctionRef<void(uint64_t, int64_t, const float*)> f) {
  ForEachRowSortedWithStep(
      [&](uint64_t key, int64_t updates, int64_t, const float* row) { f(key, updates, row); });
}

void SparseTable::ForEachRowSortedWithStep(
    absl::FunctionRef<void(uint64_t, int64_t, int64_t, const float*)> f) {
  struct Ref {
    uint64_t key;
    int stripe;
    uint32_t id;
  };
  std::vector<Ref> refs;
  refs.reserve(rows());
  for (int s = 0; s < kStripes; ++s) {
    absl::MutexLock l(&stripes_[s].mu);
    for (uint32_t id = 0; id < stripes_[s].keys.size(); ++id) {
      if (tiered() && !stripes_[s].live[id]) continue;
      refs.push_back({stripes_[s].keys[id], s, id});
    }
  }
  std::sort(refs.begin(), refs.end(), [](const Ref& a, const Ref& b) { return a.key < b.key; });
  size_t next = 0;
  auto ram_upto = [&](uint64_t bound, bool all) {
    for (; next < refs.size() && (all || refs[next].key < bound); ++next) {
      const Ref& r = refs[next];
      Stripe* st = &stripes_[r.stripe];
      absl::MutexLock l(&st->mu);
      f(r.key, st->updates[r.id], has_meta() ? st->last_step[r.id] : 0, RowPtr(st, r.id));
    }
  };
  // Rows on disk (ascending) merged in: a key lives in one tier only.
  if (store_ptr_.load() != nullptr && rows_on_disk_.load() > 0) {
    std::vector<float> row(row_floats_);
    store_ptr_.load()->ForEach([&](uint64_t key, absl::string_view v) {
      if (v.size() != 24 + row_floats_ * sizeof(float)) return;
      ram_upto(key, false);
      int64_t updates, last_step;
      std::memcpy(&updates, v.data(), 8);
      std::memcpy(&last_step, v.data() + 8, 8);
      std::memcpy(row.data(), v.data() + 24, row_floats_ * sizeof(float));
      f(key, updates, last_step, row.data());
    });
  }
  ram_upto(0, true);
}

absl::Status SparseTable::PutRow(uint64_t key, int64_t updates, const float* row,
                                 MemoryBudget* budget, int64_t step) {
  const uint64_t row_bytes = row_floats_ * sizeof(float);
  uint64_t reserved = 0;
  if (tiered()) {
    absl::Status r = Reserve(row_bytes, budget, 1);
    if (!r.ok()) return r;
    reserved = row_bytes;
  }
  Stripe* st = &stripes_[StripeOf(key)];
  absl::MutexLock l(&st->mu);
  int64_t* u = nullptr;
  absl::Status disk;
  float* dst = FindOrCreate(st, key, budget, &reserved, &u, nullptr, &disk);
  budget->Release(reserved);
  if (!disk.ok()) return disk;
  if (dst == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "table '", info_->spec.name(), "': no memory to restore row ", key, " (--memory_bytes ",
        budget->limit(), ")"));
  }
  std::memcpy(dst, row, row_floats_ * sizeof(float));
  *u = updates;
  if (has_meta()) {
    const uint32_t id = st->index.at(key);
    st->last_step[id] = step;
    st->last_ms[id] = NowMs();
    int64_t seen = max_step_.load(std::memory_order_relaxed);
    while (seen < step &&
           !max_step_.compare_exchange_weak(seen, step, std::memory_order_relaxed)) {
    }
  }
  return absl::OkStatus();
}

uint64_t SparseTable::rows() const {
  uint64_t n = 0;
  for (int s = 0; s < kStripes; ++s) {
    absl::MutexLock l(&stripes_[s].mu);
    n += stripes_[s].keys.size() - stripes_[s].free_ids.size();
  }
  return n + rows_on_disk_.load(std::memory_order_relaxed);
}

uint64_t SparseTable::bytes_held() const {
  return (rows() - rows_on_disk_.load(std::memory_order_relaxed)) * row_floats_ * sizeof(float);
}

void SparseTable::Clear(MemoryBudget* budget) {
  DropIf([](uint64_t, int64_t, int64_t) { return true; }, budget);
  absl::MutexLock l(&store_mu_);
  store_ptr_.store(nullptr);
  store_.reset();  // Removes the directory.
  rows_on_disk_.store(0);
}

}  // namespace pscluster
