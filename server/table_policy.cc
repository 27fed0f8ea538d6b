// SparseTable with an EmbeddingPolicy: admission, expiry and their counts (see table.h).
#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/table.h"

namespace pscluster {

int64_t SparseTable::NowMs() const {
  return clock_ == nullptr ? 0 : absl::ToUnixMillis(clock_->Now());
}

void SparseTable::Restart(Stripe* s, uint32_t id) {
  float* row = RowPtr(s, id);
  info_->init.FillRow(s->keys[id], info_->width, row);
  InitSlots(info_->optimizer, row + info_->width, info_->width);
  s->updates[id] = 0;
}

absl::Status SparseTable::ApplyWithPolicy(absl::Span<const uint64_t> keys, GradientFn grad,
                                          MemoryBudget* budget, int64_t step,
                                          Decisions* decisions) {
  const bool follow = decisions != nullptr && !decisions->follow.empty();
  if (follow) {
    if (decisions->follow.size() != keys.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "row_decisions: ", decisions->follow.size(), " decisions for ", keys.size(),
          " distinct keys of table '", info_->spec.name(), "'"));
    }
    for (char d : decisions->follow) {
      if (static_cast<uint8_t>(d) > kRowRestarted) {
        return absl::InvalidArgumentError(absl::StrCat(
            "row_decisions: unknown decision ", static_cast<int>(static_cast<uint8_t>(d))));
      }
    }
  }
  int count[kStripes + 1];
  std::vector<uint32_t> order;
  SortByStripe(keys, count, &order);
  const int64_t now_ms = policy_.expires() ? NowMs() : 0;
  std::string decided(keys.size(), static_cast<char>(kRowApplied));
  // Phase 1: decide each key and take the memory of the rows to make, all or nothing. Rows that
  // are restarted are counted too: CollectExpired may drop one before phase 2 (it drops only rows
  // that have expired for every push from the slowest clock on, which phase 1 restarts).
  // With a disk tier, the rows found in memory are pinned there until phase 2 is done with them,
  // and a row on disk counts as present (its step decides expiry) but needs memory to come back.
  std::vector<uint8_t> pinned(tiered() ? keys.size() : 0);
  // Rows on disk that this push updates where they are (their first push there lately).
  std::vector<uint8_t> in_place(tiered() ? keys.size() : 0);
  // Stripes whose disk reads this call holds (Stripe::readers) until its phase 2 is done there.
  std::vector<uint8_t> reading(tiered() ? kStripes : 0);
  auto unpin = [&] {
    if (!tiered()) return;
    for (int s = 0; s < kStripes; ++s) {
      if (count[s] == count[s + 1]) continue;
      Stripe* st = &stripes_[s];
      absl::MutexLock l(&st->mu);
      if (reading[s]) {
        EndDiskRead(st);
        reading[s] = 0;
      }
      for (int j = count[s]; j < count[s + 1]; ++j) {
        if (!pinned[order[j]]) continue;
        auto it = st->index.find(keys[order[j]]);
        if (it != st->index.end() && st->pins[it->second] > 0) --st->pins[it->second];
      }
    }
  };
  // What phase 1 read from disk (per key: the row, or empty for none), valid in phase 2 unless
  // the key's row on disk changed since (another call's spill, update there, or the row brought
  // back): the stripe's disk_gen then, and the keys it changed for (Stripe::disk_changes).
  std::vector<std::string> on_disk(tiered() ? keys.size() : 0);
  std::vector<uint64_t> gen(tiered() ? kStripes : 0);
  // With many keys and rows on disk, the stripes are shared out among threads (RunShared), each
  // reading its own stripes' rows from disk.
  std::atomic<int> next_stripe{0};
  std::atomic<uint64_t> need_total{0};
  absl::Mutex error_mu;
  absl::Status disk_error;
  RunShared(ShareDiskReads(keys.size()), [&] {
    std::vector<size_t> missed;
    std::vector<uint64_t> missed_keys;
    std::vector<std::string> spilled;
    uint64_t need = 0, read_back_hits = 0;
    for (int s; (s = next_stripe.fetch_add(1, std::memory_order_relaxed)) < kStripes;) {
      if (count[s] == count[s + 1]) continue;
      Stripe* st = &stripes_[s];
      absl::MutexLock l(&st->mu);
      if (tiered()) {
        gen[s] = st->disk_gen;
        ++st->readers;
        reading[s] = 1;
        // The stripe's keys not in memory, read from disk in one batched lookup.
        RowStore* store = store_ptr_.load(std::memory_order_acquire);
        missed.clear();
        missed_keys.clear();
        if (store != nullptr && rows_on_disk_.load(std::memory_order_relaxed) > 0) {
          for (int j = count[s]; j < count[s + 1]; ++j) {
            const uint64_t key = keys[order[j]];
            if (st->index.contains(key)) continue;
            // Read by a pull just before (and unchanged since): not read again. This push
            // changes it on disk or brings it back, so it is not kept any longer either way.
            if (auto kept = st->read_back.find(key); kept != st->read_back.end()) {
              on_disk[order[j]] = std::move(kept->second);
              st->read_back.erase(kept);
              ++read_back_hits;
              continue;
            }
            missed.push_back(order[j]);
            missed_keys.push_back(key);
          }
        }
        if (!missed.empty()) {
          // A row that cannot be read refuses the push (before anything is applied): taking it
          // for absent would start it again from the initializer.
          absl::Status read = store->GetMany(missed_keys, &spilled);
          if (!read.ok()) {
            absl::MutexLock e(&error_mu);
            if (disk_error.ok()) disk_error = read;
            next_stripe.store(kStripes, std::memory_order_relaxed);  // The others stop too.
            break;
          }
          for (size_t m = 0; m < missed.size(); ++m) {
            if (spilled[m].size() >= 24) on_disk[missed[m]] = std::move(spilled[m]);
          }
        }
      }
      for (int j = count[s]; j < count[s + 1]; ++j) {
        const size_t i = order[j];
        auto it = st->index.find(keys[i]);
        bool present = it != st->index.end();
        int64_t last_step = 0, last_ms = 0;
        bool in_ram = present;
        if (present) {
          if (policy_.expires()) {
            last_step = st->last_step[it->second];
            last_ms = st->last_ms[it->second];
          }
          if (tiered()) {
            ++st->pins[it->second];
            pinned[i] = 1;
          }
        } else if (tiered() && !on_disk[i].empty()) {
          present = true;
          std::memcpy(&last_step, on_disk[i].data() + 8, 8);
          std::memcpy(&last_ms, on_disk[i].data() + 16, 8);
        }
        char& d = decided[i];
        if (follow) {
          d = decisions->follow[i];
          // The copy counts what its primary counted, so that it decides alike once promoted.
          if (policy_.admits() && (d != kRowApplied || !present)) policy_.Admit(keys[i], step);
        } else if (present) {
          // An expired row is as good as gone: its key passes admission again, as it would once
          // CollectExpired had dropped the row.
          const bool expired =
              policy_.expires() && policy_.Expired(last_step, last_ms, step, now_ms);
          d = static_cast<char>(!expired                        ? kRowApplied
                                : policy_.Admit(keys[i], step) ? kRowRestarted
                                                               : kRowCounted);
        } else {
          d = static_cast<char>(policy_.Admit(keys[i], step) ? kRowApplied : kRowCounted);
        }
        if (tiered() && d != kRowCounted) {
          const uint32_t pushed = pushes_->Add(keys[i]);
          // Back into memory only when pushed lately more often than the rows spilled lately
          // (by more than half a push, on average: TinyLFU's admission against the victim, ties
          // to the victim); else it would push out a row about as hot as itself. (A margin of a
          // whole push kept the tail out even where the victims were rows never touched again:
          // embedding_bench at 10^7 keys, RAM hit ratio 0.697 against 0.733.)
          if (d == kRowApplied && !in_ram && !on_disk[i].empty() &&
              pushed * 16 <= victim_pushes_x16_.load(std::memory_order_relaxed) + 8) {
            in_place[i] = 1;
            continue;
          }
        }
        if (d != kRowCounted && (!in_ram || d == kRowRestarted)) ++need;
      }
    }
    need_total.fetch_add(need, std::memory_order_relaxed);
    read_back_hits_.fetch_add(read_back_hits, std::memory_order_relaxed);
  });
  const uint64_t need = need_total.load(std::memory_order_relaxed);
  if (!disk_error.ok()) {
    unpin();
    return absl::Status(disk_error.code(), absl::StrCat("table '", info_->spec.name(), "': ",
                                                        disk_error.message(),
                                                        "; nothing was applied"));
  }
  const uint64_t row_bytes = row_floats_ * sizeof(float);
  uint64_t reserved = need * row_bytes;
  if (reserved > 0) {
    absl::Status r = Reserve(reserved, budget, need);
    if (!r.ok()) {
      unpin();
      return r;
    }
  }
  // Phase 2: apply.
  const size_t width = info_->width;
  const OptimizerParams opt = AtStep(info_->optimizer, step);
  std::vector<float> g(width), cold(row_floats_);
  std::vector<std::pair<uint64_t, std::string>> write_back;  // Rows updated on disk.
  uint64_t made = 0, counted = 0, restarted = 0;
  absl::flat_hash_set<uint64_t> changed;  // A stripe's keys changed on disk since phase 1.
  for (int s = 0; s < kStripes; ++s) {
    if (count[s] == count[s + 1]) continue;
    Stripe* st = &stripes_[s];
    absl::ReleasableMutexLock l(&st->mu);
    write_back.clear();
    const bool changes_known = tiered() && DiskChangesSince(st, gen[s], &changed);
    // Whether what phase 1 read of keys[i] is still what the disk holds.
    auto read_holds = [&](size_t i) { return changes_known && !changed.contains(keys[i]); };
    for (int j = count[s]; j < count[s + 1]; ++j) {
      const size_t i = order[j];
      const uint8_t d = static_cast<uint8_t>(decided[i]);
      if (d == kRowCounted) {
        ++counted;
        continue;
      }
      std::string v;
      absl::Status disk_read;
      if (!in_place.empty() && in_place[i] && !st->index.contains(keys[i])) {
        // Read again if its row on disk changed since phase 1 (another push updated it there,
        // or brought it back and spilled it again).
        if (read_holds(i)) {
          v = std::move(on_disk[i]);
        } else if (!ReadSpilled(keys[i], &v, &disk_read)) {
          v.clear();
        }
      }
      if (!v.empty() || !disk_read.ok()) {
        // Updated where it lies, as in memory, and written back with the stripe's other such
        // rows below.
        if (disk_read.ok() && v.size() != 24 + row_bytes) {
          disk_read = absl::DataLossError(absl::StrCat(
              "table '", info_->spec.name(), "': disk tier ", spill_path_, " holds ", v.size(),
              " bytes for row ", keys[i], ", expected ", 24 + row_bytes));
        }
        if (!disk_read.ok()) {
          budget->Release(reserved);
          l.Release();
          unpin();
          return disk_read;
        }
        int64_t updates, last_step;
        std::memcpy(&updates, v.data(), 8);
        std::memcpy(&last_step, v.data() + 8, 8);
        std::memcpy(cold.data(), v.data() + 24, row_bytes);
        grad(i * width, width, g.data());
        ++updates;
        ApplyUpdate(opt, updates, width, g.data(), cold.data(),
                    opt.num_slots() >= 1 ? cold.data() + width : nullptr,
                    opt.num_slots() >= 2 ? cold.data() + 2 * width : nullptr);
        std::memcpy(&v[0], &updates, 8);
        if (has_meta()) {
          last_step = std::max(last_step, step);
          const int64_t last_ms = now_ms;
          std::memcpy(&v[8], &last_step, 8);
          std::memcpy(&v[16], &last_ms, 8);
        }
        std::memcpy(&v[24], cold.data(), row_bytes);
        write_back.emplace_back(keys[i], std::move(v));
        disk_reads_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      const bool present = st->index.contains(keys[i]);
      int64_t* updates = nullptr;
      bool loaded = false;
      absl::Status disk;
      const std::string* known = tiered() && read_holds(i) ? &on_disk[i] : nullptr;
      float* row =
          FindOrCreate(st, keys[i], budget, &reserved, &updates, &loaded, &disk, known);
      if (row == nullptr) {  // A disk error; else not reached: phase 1 reserved every row.
        budget->Release(reserved);
        l.Release();
        unpin();
        return disk.ok() ? absl::InternalError(absl::StrCat(
                               "table '", info_->spec.name(), "': row memory reserved for key ",
                               keys[i], " was gone"))
                         : disk;
      }
      const uint32_t id = st->index.at(keys[i]);
      if (tiered()) (present ? ram_hits_ : disk_reads_).fetch_add(present || loaded ? 1 : 0);
      if (!present && !loaded) {
        ++made;
      } else if (d == kRowRestarted) {
        Restart(st, id);
        ++restarted;
      }
      grad(i * width, width, g.data());
      ++*updates;
      ApplyUpdate(opt, *updates, width, g.data(), row,
                  opt.num_slots() >= 1 ? row + width : nullptr,
                  opt.num_slots() >= 2 ? row + 2 * width : nullptr);
      if (has_meta()) {
        st->last_step[id] = std::max(st->last_step[id], step);
        st->last_ms[id] = now_ms;
      }
    }
    if (!write_back.empty()) {
      // Under the stripe's lock: no other push or pull of these keys reads them meanwhile.
      absl::Status put = store_ptr_.load()->PutAll(write_back);
      if (!put.ok()) {
        budget->Release(reserved);
        l.Release();
        unpin();
        return absl::Status(put.code(), absl::StrCat("table '", info_->spec.name(),
                                                     "': updating rows on disk: ",
                                                     put.message()));
      }
      for (const auto& [key, v] : write_back) NoteDiskChange(st, key);
      updated_on_disk_.fetch_add(write_back.size(), std::memory_order_relaxed);
    }
    if (tiered() && reading[s]) {
      EndDiskRead(st);
      reading[s] = 0;
    }
  }
  budget->Release(reserved);
  unpin();
  int64_t seen = max_step_.load(std::memory_order_relaxed);
  while (seen < step && !max_step_.compare_exchange_weak(seen, step, std::memory_order_relaxed)) {
  }
  admissions_.fetch_add(made, std::memory_order_relaxed);
  not_admitted_.fetch_add(counted, std::memory_order_relaxed);
  expiries_.fetch_add(restarted, std::memory_order_relaxed);
  if (decisions != nullptr && !follow && policy_.active()) decisions->made = std::move(decided);
  return absl::OkStatus();
}

uint64_t SparseTable::CollectExpired(int64_t min_clock, MemoryBudget* budget) {
  if (!policy_.expires()) return 0;
  const int64_t now_ms = NowMs();
  uint64_t n = DropIf(
      [&](uint64_t, int64_t last_step, int64_t last_ms) {
        return policy_.Collectable(last_step, last_ms, min_clock, now_ms);
      },
      budget, /*include_disk=*/false);
  if (tiered()) n += SweepExpiredOnDisk(min_clock, now_ms);
  expiries_.fetch_add(n, std::memory_order_relaxed);
  return n;
}

uint64_t SparseTable::SweepExpiredOnDisk(int64_t min_clock, int64_t now_ms) {
  absl::MutexLock sweep(&sweep_mu_);
  RowStore* store = store_ptr_.load(std::memory_order_acquire);
  if (store == nullptr || rows_on_disk_.load(std::memory_order_relaxed) == 0) return 0;
  auto collectable = [&](absl::string_view v) {
    if (v.size() < 24) return false;
    int64_t last_step, last_ms;
    std::memcpy(&last_step, v.data() + 8, 8);
    std::memcpy(&last_ms, v.data() + 16, 8);
    return policy_.Collectable(last_step, last_ms, min_clock, now_ms);
  };
  // The next kDiskSweepRows rows in key order from where the last sweep stopped.
  std::vector<uint64_t> candidates;
  uint64_t looked = 0, next = 0;
  bool more = false;
  store->ForEachFrom(disk_sweep_from_, [&](uint64_t key, absl::string_view v) {
    if (looked == kDiskSweepRows) {
      more = true;
      next = key;
      return false;
    }
    ++looked;
    if (collectable(v)) candidates.push_back(key);
    return true;
  });
  disk_sweep_from_ = more ? next : 0;
  uint64_t freed = 0;
  std::string v;
  for (uint64_t key : candidates) {
    // Under the key's stripe lock, checked again: a push may have brought the row back or
    // touched it since. A push that read it before keeps its copy only while the change is not
    // noted in the stripe (Stripe::disk_gen).
    Stripe* st = &stripes_[StripeOf(key)];
    absl::MutexLock l(&st->mu);
    if (st->index.contains(key) || !store->Get(key, &v) || !collectable(v)) continue;
    absl::Status s = store->Delete(key);
    if (!s.ok()) {
      Logger("server")->error("table '{}': freeing an expired row on disk: {}",
                              info_->spec.name(), s.ToString());
      continue;
    }
    NoteDiskChange(st, key);
    rows_on_disk_.fetch_sub(1, std::memory_order_relaxed);
    ++freed;
  }
  return freed;
}

SparseTable::PolicyCounts SparseTable::policy_counts() const {
  PolicyCounts c;
  c.admissions = admissions_.load(std::memory_order_relaxed);
  c.not_admitted = not_admitted_.load(std::memory_order_relaxed);
  c.expiries = expiries_.load(std::memory_order_relaxed);
  c.reads_without_row = reads_without_row_.load(std::memory_order_relaxed);
  c.sketch_bytes = policy_.sketch_bytes();
  c.rows_on_disk = rows_on_disk_.load(std::memory_order_relaxed);
  c.ram_hits = ram_hits_.load(std::memory_order_relaxed);
  c.disk_reads = disk_reads_.load(std::memory_order_relaxed);
  c.spills = spills_.load(std::memory_order_relaxed);
  c.updated_on_disk = updated_on_disk_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace pscluster
