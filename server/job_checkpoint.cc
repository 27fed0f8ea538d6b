// Job: checkpoints (write, verify, restore) and safetensors export.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/checkpoint.pb.h"
#include "common/checkpoint_file.h"
#include "common/crc32c.h"
#include "common/safetensors.h"
#include "server/job.h"
#include "server/validate.h"

namespace pscluster {
namespace {

uint64_t GetLe64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

std::vector<StepCounts::Run> StepRunsOf(const v1::CheckpointBlock& cb) {
  std::vector<StepCounts::Run> runs;
  runs.reserve(cb.step_runs_size());
  for (const auto& r : cb.step_runs()) runs.push_back({r.end(), r.updates()});
  return runs;
}

}  // namespace

// ------------------------------------------------------------------ checkpoints

absl::StatusOr<Job::Snapshot> Job::MakeCheckpoint(const std::string& node_id,
                                                  int64_t now_unix_ms, std::optional<int64_t> at) {
  if (dropped_) return absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped"));
  absl::MutexLock l(&state_mu_);  // Exclusive: no push changes the tables meanwhile.
  return MakeCheckpointLocked(node_id, now_unix_ms, at);
}

absl::StatusOr<Job::Snapshot> Job::MakeCheckpointLocked(const std::string& node_id,
                                                        int64_t now_unix_ms,
                                                        std::optional<int64_t> at,
                                                        const std::vector<bool>* only) {
  Snapshot snap;
  std::string& f = snap.bytes;
  CheckpointWriter writer([&f](absl::string_view piece) {
    f.append(piece.data(), piece.size());
    return absl::OkStatus();
  });
  absl::Status s = WriteCheckpointLocked(
      node_id, now_unix_ms, at, only,
      [&](int64_t, uint64_t bytes) -> absl::StatusOr<CheckpointWriter*> {
        f.reserve(bytes);
        return &writer;
      },
      &snap);
  if (!s.ok()) return s;
  return snap;
}

absl::StatusOr<Job::Snapshot> Job::MakeCopyLocked(const std::string& node_id,
                                                  int64_t now_unix_ms,
                                                  const std::vector<bool>* only) {
  if (!HasDiskTierLocked() || config_.spill_dir.empty()) {
    return MakeCheckpointLocked(node_id, now_unix_ms, std::nullopt, only);
  }
  auto spool = SpoolFile::Create(config_.spill_dir, absl::StrCat("copy of job '", id(), "'"));
  if (!spool.ok()) return spool.status();
  Snapshot snap;
  SpoolFile& file = **spool;
  CheckpointWriter writer([&file](absl::string_view piece) { return file.Append(piece); });
  absl::Status s = WriteCheckpointLocked(
      node_id, now_unix_ms, std::nullopt, only,
      [&](int64_t, uint64_t) -> absl::StatusOr<CheckpointWriter*> { return &writer; }, &snap);
  if (!s.ok()) return s;
  snap.spool = std::move(*spool);
  return snap;
}

absl::StatusOr<Job::Snapshot> Job::SnapshotForCopy(const std::string& node_id,
                                                   int64_t now_unix_ms, bool seal) {
  if (dropped_) return absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped"));
  absl::MutexLock l(&state_mu_);
  if (seal) sealed_ = true;
  return MakeCopyLocked(node_id, now_unix_ms, nullptr);
}

std::string Job::SpoolDir() const {
  absl::ReaderMutexLock l(&state_mu_);
  return HasDiskTierLocked() ? config_.spill_dir : std::string();
}

std::unique_ptr<CheckpointSource> SourceOf(const CheckpointSnapshot& snap) {
  if (snap.spool != nullptr) return std::make_unique<SpoolCheckpointSource>(snap.spool);
  return std::make_unique<StringCheckpointSource>(snap.bytes);
}

absl::StatusOr<Job::Snapshot> Job::StreamCheckpoint(const std::string& node_id,
                                                    int64_t now_unix_ms, std::optional<int64_t> at,
                                                    CheckpointOpener open) {
  if (dropped_) return absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped"));
  absl::MutexLock l(&state_mu_);  // Exclusive: no push changes the tables meanwhile.
  Snapshot snap;
  absl::Status s = WriteCheckpointLocked(node_id, now_unix_ms, at, nullptr, open, &snap);
  if (!s.ok()) return s;
  return snap;
}

bool Job::HasDiskTier() const {
  absl::ReaderMutexLock l(&state_mu_);
  return HasDiskTierLocked();
}

bool Job::HasDiskTierLocked() const {
  for (const TableState& t : tables_) {
    if (t.sparse != nullptr && t.sparse->tiered()) return true;
  }
  return false;
}

absl::Status Job::WriteCheckpointLocked(const std::string& node_id, int64_t now_unix_ms,
                                        std::optional<int64_t> at, const std::vector<bool>* only,
                                        CheckpointOpener open, Snapshot* snap) {
  auto covers = [only](uint32_t shard) {
    return only == nullptr || (shard < only->size() && (*only)[shard]);
  };
  v1::CheckpointHeader h;
  h.set_job_id(id());
  h.set_epoch(epoch_);
  h.set_num_virtual_shards(config_.num_shards);
  h.set_node_id(node_id);
  h.set_created_unix_ms(now_unix_ms);
  for (uint32_t i = 0; i < held_.size(); ++i) {
    if (held_[i] && covers(i)) h.add_shards(i);
  }
  {
    absl::MutexLock c(&clock_mu_);
    // With aggregation the tables reflect exactly the steps applied (the read gate's released
    // clock); later pushes wait in buffers that a checkpoint does not keep, so every clock is
    // recorded there.
    const int64_t applied = at.has_value() ? *at : gate_.released();
    int64_t step = config_.consistency.aggregate() ? applied : clocks_.Min();
    for (uint32_t w = 0; w < clocks_.size(); ++w) {
      auto* wc = h.add_clocks();
      wc->set_worker(w);
      wc->set_clock(config_.consistency.aggregate() ? applied : clocks_.clock(w));
    }
    h.set_step(step);
    snap->step = step;
  }
  // Pass 1: layout.
  uint64_t off = 0;
  std::vector<uint64_t> sparse_rows(tables_.size(), 0);
  struct SparseRows {
    std::vector<uint64_t> keys;
    std::vector<int64_t> updates, last_steps;
    std::string values;
  };
  std::vector<SparseRows> partial(only != nullptr ? tables_.size() : 0);
  for (size_t ti = 0; ti < tables_.size(); ++ti) {
    const TableState& t = tables_[ti];
    auto* ct = h.add_tables();
    *ct->mutable_spec() = t.info->spec;
    const uint64_t fpe = t.info->floats_per_elem();
    if (t.dense) {
      for (uint64_t b = 0; b < t.dense->num_blocks(); ++b) {
        DenseBlock* blk = t.dense->block(b);
        if (blk == nullptr || !covers(t.dense->ShardOf(b))) continue;
        auto* cb = ct->add_blocks();
        cb->set_block(b);
        cb->set_elems(blk->elems);
        {
          absl::MutexLock bl(&blk->mu);
          cb->set_updates(blk->steps.max());
          if (!blk->steps.uniform()) {
            for (const StepCounts::Run& r : blk->steps.Runs()) {
              auto* sr = cb->add_step_runs();
              sr->set_end(r.end);
              sr->set_updates(r.steps);
            }
          }
        }
        cb->set_offset(off);
        off += blk->elems * fpe * sizeof(float);
      }
    } else {
      uint64_t rows = t.sparse->rows();
      if (only != nullptr && t.sparse->tiered()) {
        // A snapshot of some shards of a table that may not fit in memory: their rows counted
        // now (the header, which comes first, needs the count), written by later passes.
        rows = 0;
        t.sparse->ForEachRowSortedWithStep([&](uint64_t key, int64_t, int64_t, const float*) {
          if (covers(t.sparse->ShardOf(key))) ++rows;
        });
      } else if (only != nullptr) {
        // A snapshot of some shards (a live copy's seed): only their rows, gathered now (the
        // header, which comes first, needs their count).
        SparseRows& c = partial[ti];
        const size_t row_bytes = t.info->width * fpe * sizeof(float);
        t.sparse->ForEachRowSortedWithStep(
            [&](uint64_t key, int64_t u, int64_t last_step, const float* row) {
              if (!covers(t.sparse->ShardOf(key))) return;
              c.keys.push_back(key);
              c.updates.push_back(u);
              c.last_steps.push_back(last_step);
              c.values.append(reinterpret_cast<const char*>(row), row_bytes);
            });
        rows = c.keys.size();
      }
      sparse_rows[ti] = rows;
      ct->set_rows(rows);
      ct->set_values_offset(off);
      off += rows * t.info->width * fpe * sizeof(float);
      ct->set_keys_offset(off);
      off += rows * 8;
      ct->set_updates_offset(off);
      off += rows * 8;
      if (t.sparse->policy().expires()) {
        ct->set_last_steps_offset(off);
        off += rows * 8;
      }
      if (const CountMinSketch* sketch = t.sparse->policy().sketch()) {
        ct->set_admit_sketch_offset(off);
        ct->set_admit_sketch_bytes(sketch->bytes());
        off += sketch->bytes();
      }
    }
  }
  h.set_data_bytes(off);
  auto opened = open(snap->step, 16 + h.ByteSizeLong() + off + 20);
  if (!opened.ok()) return opened.status();
  CheckpointWriter& w = **opened;
  absl::Status st = w.Head(h);
  if (!st.ok()) return st;
  const uint64_t data_start = w.bytes();
  auto bytes_of = [](const auto& v) {
    return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * 8);
  };
  // Pass 2: data.
  for (size_t ti = 0; ti < tables_.size() && st.ok(); ++ti) {
    const TableState& t = tables_[ti];
    const uint64_t fpe = t.info->floats_per_elem();
    if (t.dense) {
      for (uint64_t b = 0; b < t.dense->num_blocks() && st.ok(); ++b) {
        DenseBlock* blk = t.dense->block(b);
        if (blk == nullptr || !covers(t.dense->ShardOf(b))) continue;
        absl::MutexLock bl(&blk->mu);
        st = w.Append(absl::string_view(reinterpret_cast<const char*>(blk->weights.get()),
                                        blk->elems * sizeof(float)));
        if (st.ok()) {
          st = w.Append(absl::string_view(reinterpret_cast<const char*>(blk->slot_data.get()),
                                          blk->elems * (fpe - 1) * sizeof(float)));
        }
      }
      continue;
    }
    const size_t row_bytes = t.info->width * fpe * sizeof(float);
    const bool expires = t.sparse->policy().expires();
    if (only != nullptr && !t.sparse->tiered()) {
      SparseRows& c = partial[ti];
      st = w.Append(c.values);
      if (st.ok()) st = w.Append(bytes_of(c.keys));
      if (st.ok()) st = w.Append(bytes_of(c.updates));
      if (st.ok() && expires) st = w.Append(bytes_of(c.last_steps));
    } else if (!t.sparse->tiered()) {
      // In memory: one pass, the small per-row sections gathered meanwhile.
      std::vector<uint64_t> keys;
      std::vector<int64_t> updates, last_steps;
      keys.reserve(sparse_rows[ti]);
      updates.reserve(sparse_rows[ti]);
      if (expires) last_steps.reserve(sparse_rows[ti]);
      t.sparse->ForEachRowSortedWithStep(
          [&](uint64_t key, int64_t u, int64_t last_step, const float* row) {
            keys.push_back(key);
            updates.push_back(u);
            if (expires) last_steps.push_back(last_step);
            if (st.ok()) st = w.Append(absl::string_view(reinterpret_cast<const char*>(row), row_bytes));
          });
      if (st.ok()) st = w.Append(bytes_of(keys));
      if (st.ok()) st = w.Append(bytes_of(updates));
      if (st.ok() && expires) st = w.Append(bytes_of(last_steps));
    } else {
      // With a disk tier the table may be far larger than memory: nothing of it is gathered,
      // each section is one more pass over both tiers in key order (no push runs meanwhile).
      const int sections = expires ? 4 : 3;
      for (int section = 0; section < sections && st.ok(); ++section) {
        uint64_t n = 0;
        t.sparse->ForEachRowSortedWithStep(
            [&](uint64_t key, int64_t u, int64_t last_step, const float* row) {
              if (only != nullptr && !covers(t.sparse->ShardOf(key))) return;
              ++n;
              if (!st.ok()) return;
              switch (section) {
                case 0:
                  st = w.Append(absl::string_view(reinterpret_cast<const char*>(row), row_bytes));
                  break;
                case 1:
                  st = w.Append(absl::string_view(reinterpret_cast<const char*>(&key), 8));
                  break;
                case 2:
                  st = w.Append(absl::string_view(reinterpret_cast<const char*>(&u), 8));
                  break;
                default:
                  st = w.Append(absl::string_view(reinterpret_cast<const char*>(&last_step), 8));
              }
            });
        if (st.ok() && n != sparse_rows[ti]) {
          st = absl::InternalError(absl::StrCat("table '", t.info->spec.name(), "' had ",
                                                sparse_rows[ti], " rows, then ", n,
                                                " while its checkpoint was written"));
        }
      }
    }
    // Pushes wait on the job's lock: none counts while the sketch is copied.
    if (st.ok()) {
      if (const CountMinSketch* sketch = t.sparse->policy().sketch()) {
        std::string copy;
        sketch->AppendTo(&copy);
        st = w.Append(copy);
      }
    }
  }
  if (!st.ok()) return st;
  if (w.bytes() - data_start != off) {
    return absl::InternalError("checkpoint layout changed while writing");  // Own invariant.
  }
  auto crc = w.Finish();
  if (!crc.ok()) return crc.status();
  snap->crc = *crc;
  snap->size = w.bytes();
  return absl::OkStatus();
}

absl::StatusOr<std::pair<int64_t, uint32_t>> Job::Restore(const std::string& f,
                                                          absl::string_view path,
                                                          bool set_clocks) {
  StringCheckpointSource source(f);
  return Restore(source, path, set_clocks);
}

absl::StatusOr<std::pair<int64_t, uint32_t>> Job::Restore(CheckpointSource& source,
                                                          absl::string_view path,
                                                          bool set_clocks) {
  absl::MutexLock l(&state_mu_);
  return RestoreLocked(source, path, set_clocks);
}

absl::StatusOr<std::vector<int64_t>> Job::CheckpointClocks(const std::string& file,
                                                           absl::string_view path) {
  StringCheckpointSource source(file);
  return CheckpointClocks(source, path);
}

absl::StatusOr<std::vector<int64_t>> Job::CheckpointClocks(CheckpointSource& source,
                                                           absl::string_view path) {
  auto parsed = VerifyCheckpoint(source, path);
  if (!parsed.ok()) return parsed.status();
  std::vector<int64_t> clocks;
  for (const auto& wc : parsed->header.clocks()) {
    if (wc.worker() >= clocks.size()) clocks.resize(wc.worker() + 1, 0);
    clocks[wc.worker()] = wc.clock();
  }
  return clocks;
}

absl::StatusOr<std::pair<int64_t, uint32_t>> Job::RestoreLocked(CheckpointSource& source,
                                                                absl::string_view path,
                                                                bool set_clocks) {
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " refused: ", what,
                                            "; nothing was loaded"));
  };
  auto parsed = VerifyCheckpoint(source, path);
  if (!parsed.ok()) return parsed.status();
  const v1::CheckpointHeader& h = parsed->header;
  if (h.job_id() != id()) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", path, " belongs to job '",
                                                      h.job_id(), "', not '", id(), "'"));
  }
  if (h.num_virtual_shards() != config_.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", path, " has ", h.num_virtual_shards(), " virtual shards, job '", id(),
        "' has ", config_.num_shards));
  }
  const uint64_t data_start = parsed->data_start;
  const uint64_t data_bytes = parsed->data_bytes;
  auto in_range = [&](uint64_t off, uint64_t len) { return off <= data_bytes && len <= data_bytes - off; };
  // The data sections are read a piece at a time (a file may be far larger than memory; a
  // checkpoint in memory is read in place).
  std::string scratch, scratch2, scratch3, scratch4;
  auto read = [&](uint64_t off, uint64_t n, std::string* into) {
    return source.Read(data_start + off, static_cast<size_t>(n), into);
  };
  constexpr uint64_t kRowsPerPiece = 65536;

  // Validate every table section before anything changes.
  std::vector<uint32_t> table_of(h.tables_size());
  uint64_t new_bytes = 0, old_bytes = 0;
  std::vector<bool> covered(config_.num_shards, false);
  for (uint32_t s : h.shards()) {
    if (s >= config_.num_shards) return corrupt(absl::StrCat("shard ", s, " out of range"));
    covered[s] = true;
  }
  for (int i = 0; i < h.tables_size(); ++i) {
    const auto& ct = h.tables(i);
    auto it = table_index_.find(ct.spec().name());
    if (it == table_index_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path, " holds table '", ct.spec().name(), "' which job '", id(),
          "' has not declared; CreateTables first"));
    }
    const TableState& t = tables_[it->second];
    if (ct.spec().SerializeAsString() != t.info->spec.SerializeAsString()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path, ": table '", ct.spec().name(),
          "' was declared with a different spec (shape, optimizer or initializer)"));
    }
    table_of[i] = it->second;
    const uint64_t fpe = t.info->floats_per_elem();
    if (t.dense) {
      for (const auto& cb : ct.blocks()) {
        if (cb.block() >= t.dense->num_blocks() || cb.elems() != t.dense->BlockLen(cb.block()) ||
            !in_range(cb.offset(), cb.elems() * fpe * sizeof(float))) {
          return corrupt(absl::StrCat("table '", ct.spec().name(), "' block ", cb.block(),
                                      " does not fit the table or the file"));
        }
        if (cb.updates() < 0) {
          return corrupt(absl::StrCat("table '", ct.spec().name(), "' block ", cb.block(),
                                      " has a negative step count"));
        }
        if (cb.step_runs_size() > 0) {
          StepCounts check(cb.elems());
          absl::Status runs = check.SetRuns(StepRunsOf(cb));
          if (!runs.ok()) {
            return corrupt(absl::StrCat("table '", ct.spec().name(), "' block ", cb.block(), " ",
                                        runs.message()));
          }
        }
      }
    } else {
      const uint64_t rows = ct.rows();
      if (rows > data_bytes / 8 || !in_range(ct.keys_offset(), rows * 8) ||
          !in_range(ct.updates_offset(), rows * 8) ||
          (ct.last_steps_offset() != 0 && !in_range(ct.last_steps_offset(), rows * 8)) ||
          !in_range(ct.values_offset(), rows * t.info->width * fpe * sizeof(float))) {
        return corrupt(absl::StrCat("table '", ct.spec().name(), "' rows do not fit the file"));
      }
      if (ct.admit_sketch_bytes() != 0) {
        const CountMinSketch* sketch = t.sparse->policy().sketch();
        if (sketch == nullptr || sketch->bytes() != ct.admit_sketch_bytes() ||
            !in_range(ct.admit_sketch_offset(), ct.admit_sketch_bytes())) {
          return corrupt(absl::StrCat("table '", ct.spec().name(), "' admission sketch of ",
                                      ct.admit_sketch_bytes(),
                                      " bytes does not fit the table's count filter or the file"));
        }
      }
      const uint64_t space = t.info->spec.key_space();
      uint64_t prev = 0;
      for (uint64_t first = 0; first < rows; first += kRowsPerPiece) {
        const uint64_t n = std::min(kRowsPerPiece, rows - first);
        auto keys = read(ct.keys_offset() + 8 * first, 8 * n, &scratch);
        if (!keys.ok()) return keys.status();
        for (uint64_t r = 0; r < n; ++r) {
          uint64_t k = GetLe64(keys->data() + 8 * r);
          if ((first + r > 0 && k <= prev) || (space != 0 && k >= space)) {
            return corrupt(absl::StrCat("table '", ct.spec().name(), "' has a bad key ", k));
          }
          prev = k;
          // A table with a disk tier spills cold rows as the restore fills it: only its rows
          // that must stay in memory count (none ahead of time).
          if (held_[t.sparse->ShardOf(k)] && !t.sparse->tiered()) {
            new_bytes += t.info->width * fpe * sizeof(float);
          }
        }
      }
      if (!t.sparse->tiered()) old_bytes += t.sparse->bytes_held();
    }
  }
  if (budget_->limit() != 0 && budget_->used() - old_bytes + new_bytes > budget_->limit()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "checkpoint ", path, " needs ", new_bytes, " bytes of rows; --memory_bytes limit ",
        budget_->limit(), " would be exceeded"));
  }
  // Apply.
  std::vector<bool> replace(config_.num_shards);
  for (uint32_t s = 0; s < config_.num_shards; ++s) replace[s] = covered[s] && held_[s];
  for (int i = 0; i < h.tables_size(); ++i) {
    const auto& ct = h.tables(i);
    TableState& t = tables_[table_of[i]];
    const uint64_t fpe = t.info->floats_per_elem();
    if (t.dense) {
      for (const auto& cb : ct.blocks()) {
        DenseBlock* blk = t.dense->block(cb.block());
        if (blk == nullptr || !replace[t.dense->ShardOf(cb.block())]) continue;
        auto bytes = read(cb.offset(), cb.elems() * fpe * sizeof(float), &scratch);
        if (!bytes.ok()) return bytes.status();  // Read before: only a file changed meanwhile.
        absl::MutexLock bl(&blk->mu);
        std::memcpy(blk->MutableWeights(), bytes->data(), cb.elems() * sizeof(float));
        std::memcpy(blk->slot_data.get(), bytes->data() + cb.elems() * sizeof(float),
                    cb.elems() * (fpe - 1) * sizeof(float));
        if (cb.step_runs_size() > 0) {
          (void)blk->steps.SetRuns(StepRunsOf(cb));  // Validated above.
        } else {
          blk->steps.SetUniform(cb.updates());
        }
      }
    } else {
      t.sparse->DropShards(replace, budget_);
      const size_t row_floats = t.info->width * fpe;
      const size_t row_bytes = row_floats * sizeof(float);
      std::vector<float> row(row_floats);
      // A table with a disk tier takes rows into memory while it has room, then the rest
      // straight to disk as whole files of its store (not each into memory and spilled again,
      // nor through the store's memtables: the file's rows come in ascending key order).
      const bool tiered = t.sparse->tiered();
      bool memory_full = false;
      std::unique_ptr<SparseTable::DiskLoad> to_disk;
      for (uint64_t first = 0; first < ct.rows(); first += kRowsPerPiece) {
        const uint64_t n = std::min(kRowsPerPiece, ct.rows() - first);
        auto keys = read(ct.keys_offset() + 8 * first, 8 * n, &scratch);
        if (!keys.ok()) return keys.status();
        auto updates = read(ct.updates_offset() + 8 * first, 8 * n, &scratch2);
        if (!updates.ok()) return updates.status();
        auto values = read(ct.values_offset() + row_bytes * first, row_bytes * n, &scratch3);
        if (!values.ok()) return values.status();
        absl::string_view last_steps;
        if (ct.last_steps_offset() != 0) {
          auto ls = read(ct.last_steps_offset() + 8 * first, 8 * n, &scratch4);
          if (!ls.ok()) return ls.status();
          last_steps = *ls;
        }
        for (uint64_t r = 0; r < n; ++r) {
          uint64_t k = GetLe64(keys->data() + 8 * r);
          if (!replace[t.sparse->ShardOf(k)]) continue;
          int64_t u = static_cast<int64_t>(GetLe64(updates->data() + 8 * r));
          std::memcpy(row.data(), values->data() + r * row_bytes, row_bytes);
          const int64_t last_step = !last_steps.empty()
                                        ? static_cast<int64_t>(GetLe64(last_steps.data() + 8 * r))
                                        : h.step();
          if (tiered && !memory_full) {
            memory_full = !budget_->TryReserve(row_bytes);
            if (!memory_full) budget_->Release(row_bytes);
          }
          if (memory_full) {
            if (to_disk == nullptr) {
              auto load = t.sparse->StartDiskLoad();
              if (!load.ok()) return load.status();
              to_disk = std::move(*load);
            }
            absl::Status s = to_disk->Add(k, u, last_step, row.data());
            if (!s.ok()) return s;
            continue;
          }
          absl::Status s = t.sparse->PutRow(k, u, row.data(), budget_, last_step);
          if (!s.ok()) return s;
        }
      }
      if (to_disk != nullptr) {
        absl::Status s = to_disk->Finish();
        if (!s.ok()) return s;
      }
      if (ct.admit_sketch_bytes() != 0) {
        // Added, not replaced: a recovery restores one file per former server (disjoint keys)
        // into the same table, and a key's count may only be overestimated, never lost.
        auto sketch = read(ct.admit_sketch_offset(), ct.admit_sketch_bytes(), &scratch);
        if (!sketch.ok()) return sketch.status();
        absl::Status s = t.sparse->admission_sketch()->AddFrom(*sketch);
        if (!s.ok()) return s;  // Validated above.
      }
    }
  }
  if (set_clocks) {
    absl::MutexLock c(&clock_mu_);
    for (const auto& wc : h.clocks()) clocks_.Set(wc.worker(), wc.clock());
    applied_.ClearAll();
    agg_.Clear();
    gate_.Reset(clocks_.Min());
    checkpointed_step_ = gate_.released();
  }
  return std::make_pair(h.step(), static_cast<uint32_t>(h.tables_size()));
}

Job::ClockState Job::GetClockState() const {
  absl::MutexLock c(&clock_mu_);
  return ClockState{clocks_.clocks(), applied_.all(), clocks_.left()};
}

void Job::ClocksToProto(const ClockState& state, v1::CopyClocks* out) {
  for (uint32_t w = 0; w < state.clocks.size(); ++w) {
    v1::WorkerClock* c = out->add_clocks();
    c->set_worker(w);
    c->set_clock(state.clocks[w]);
  }
  for (uint32_t w = 0; w < state.applied.size(); ++w) {
    for (const auto& [step, ids] : state.applied[w]) {
      v1::AppliedChunks* a = out->add_applied();
      a->set_worker(w);
      a->set_step(step);
      a->mutable_identities()->Reserve(static_cast<int>(ids.size()));
      for (uint64_t id : ids) a->add_identities(id);
    }
  }
}

absl::StatusOr<Job::ClockState> Job::ClocksFromProto(const v1::CopyClocks& in,
                                                     uint32_t num_workers) {
  ClockState state;
  state.clocks.assign(num_workers, 0);
  state.applied.resize(num_workers);
  std::vector<bool> seen(num_workers, false);
  for (int i = 0; i < in.clocks_size(); ++i) {
    const v1::WorkerClock& c = in.clocks(i);
    if (c.worker() >= num_workers || seen[c.worker()]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "clocks.clocks[", i, "].worker: rank ", c.worker(),
          c.worker() >= num_workers ? absl::StrCat(" is outside the job's ", num_workers,
                                                   " workers")
                                    : std::string(" is given twice")));
    }
    absl::Status st = CheckStep(c.clock(), absl::StrCat("clocks.clocks[", i, "].clock"));
    if (!st.ok()) return st;
    seen[c.worker()] = true;
    state.clocks[c.worker()] = c.clock();
  }
  for (int i = 0; i < in.applied_size(); ++i) {
    const v1::AppliedChunks& a = in.applied(i);
    if (a.worker() >= num_workers) {
      return absl::InvalidArgumentError(absl::StrCat("clocks.applied[", i, "].worker: rank ",
                                                     a.worker(), " is outside the job's ",
                                                     num_workers, " workers"));
    }
    absl::Status st = CheckStep(a.step(), absl::StrCat("clocks.applied[", i, "].step"));
    if (!st.ok()) return st;
    auto& ids = state.applied[a.worker()][a.step()];
    ids.insert(a.identities().begin(), a.identities().end());
  }
  return state;
}

void Job::SetClockState(const ClockState& state) {
  absl::MutexLock c(&clock_mu_);
  clocks_.SetEach(state.clocks);
  for (uint32_t w = 0; w < applied_.size(); ++w) {
    applied_.Clear(w);
    if (w < state.applied.size()) applied_.Join(w, state.applied[w], clocks_.clock(w));
  }
  gate_.Reset(clocks_.Min());
  checkpointed_step_ = gate_.released();
}

absl::StatusOr<Job::Snapshot> Job::CheckpointShards(const std::string& node_id,
                                                    int64_t now_unix_ms,
                                                    const std::vector<bool>& shards) {
  if (dropped_) return absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped"));
  absl::MutexLock l(&state_mu_);
  return MakeCopyLocked(node_id, now_unix_ms, &shards);
}

void Job::NoteSourceEpoch(uint64_t epoch) {
  if (epoch <= source_epoch_.load(std::memory_order_acquire)) return;
  absl::MutexLock c(&clock_mu_);
  if (epoch <= source_epoch_.load(std::memory_order_relaxed)) return;
  clocks_before_epoch_[epoch] = ClockState{clocks_.clocks(), applied_.all(), clocks_.left()};
  // A few map changes back are enough: a takeover adopts at the epoch of the map in force.
  while (clocks_before_epoch_.size() > 8) clocks_before_epoch_.erase(clocks_before_epoch_.begin());
  source_epoch_.store(epoch, std::memory_order_release);
}

Job::ClockState Job::ClockStateBefore(uint64_t epoch) const {
  absl::MutexLock c(&clock_mu_);
  auto it = clocks_before_epoch_.lower_bound(epoch);
  if (it != clocks_before_epoch_.end()) return it->second;
  return ClockState{clocks_.clocks(), applied_.all(), clocks_.left()};
}

absl::Status Job::AdoptReplica(const Snapshot& copy, const ClockState& other,
                               absl::string_view from) {
  auto r = Restore(*SourceOf(copy), from, /*set_clocks=*/false);
  if (!r.ok()) return r.status();
  absl::MutexLock c(&clock_mu_);
  JoinClocksLocked(other.clocks, other.applied);
  return absl::OkStatus();
}

void Job::JoinClocksLocked(
    const std::vector<int64_t>& clocks,
    const std::vector<std::map<int64_t, absl::flat_hash_set<uint64_t>>>& applied) {
  // A rank not heard from yet on a server that joined the job mid-run takes the copy's clock.
  clocks_.Join(clocks);
  for (uint32_t w = 0; w < clocks_.size() && w < clocks.size(); ++w) {
    if (w < applied.size()) {
      applied_.Join(w, applied[w], clocks_.clock(w));
    } else {
      applied_.Trim(w, clocks_.clock(w));
    }
  }
  gate_.Lower(clocks_.Min());
  checkpointed_step_ = std::min(checkpointed_step_, gate_.released());
}

void Job::ClocksUnknown() {
  absl::MutexLock c(&clock_mu_);
  clocks_.MarkUnknown();
}

void Job::RewindClocks(int64_t step) {
  absl::MutexLock c(&clock_mu_);
  clocks_.SetAll(step);
  applied_.ClearAll();
  agg_.Clear();
  gate_.Reset(step);
  checkpointed_step_ = step;
}

absl::StatusOr<std::pair<std::string, uint32_t>> Job::Export(
    const std::vector<std::string>& names) {
  if (dropped_) return absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped"));
  absl::MutexLock l(&state_mu_);
  std::vector<uint32_t> which;
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = table_index_.find(names[i]);
    if (it == table_index_.end()) {
      return absl::NotFoundError(absl::StrCat("tables[", i, "]: unknown table '", names[i],
                                              "' in job '", id(), "'"));
    }
    which.push_back(it->second);
  }
  if (names.empty()) {
    for (uint32_t i = 0; i < tables_.size(); ++i) {
      if (tables_[i].dense) which.push_back(i);
    }
  }
  std::vector<std::string> storage;  // Owns the bytes the tensors point at.
  storage.reserve(which.size() * 2);
  std::vector<SafetensorsTensor> tensors;
  for (uint32_t ti : which) {
    const TableState& t = tables_[ti];
    const std::string& name = t.info->spec.name();
    if (t.dense) {
      const bool whole = t.dense->blocks_held() == t.dense->num_blocks();
      if (whole) {
        std::string bytes;
        bytes.reserve(t.info->elems * 4);
        for (uint64_t b = 0; b < t.dense->num_blocks(); ++b) {
          DenseBlock* blk = t.dense->block(b);
          absl::MutexLock bl(&blk->mu);
          bytes.append(reinterpret_cast<const char*>(blk->weights.get()), blk->elems * 4);
        }
        storage.push_back(std::move(bytes));
        std::vector<uint64_t> shape(t.info->spec.shape().dims().begin(),
                                    t.info->spec.shape().dims().end());
        tensors.push_back({name, v1::DT_FLOAT32, shape, storage.back()});
      } else {
        for (uint64_t b = 0; b < t.dense->num_blocks(); ++b) {
          DenseBlock* blk = t.dense->block(b);
          if (blk == nullptr) continue;
          absl::MutexLock bl(&blk->mu);
          storage.emplace_back(reinterpret_cast<const char*>(blk->weights.get()), blk->elems * 4);
          tensors.push_back({absl::StrCat(name, ":block:", b), v1::DT_FLOAT32, {blk->elems},
                             storage.back()});
        }
      }
    } else {
      std::string keys, values;
      uint64_t rows = 0;
      const uint32_t width = t.info->width;
      t.sparse->ForEachRowSorted([&](uint64_t key, int64_t, const float* row) {
        keys.append(reinterpret_cast<const char*>(&key), 8);
        values.append(reinterpret_cast<const char*>(row), width * 4);
        ++rows;
      });
      storage.push_back(std::move(keys));
      tensors.push_back({absl::StrCat(name, ":keys"), v1::DT_UINT64, {rows}, storage.back()});
      storage.push_back(std::move(values));
      tensors.push_back({absl::StrCat(name, ":values"), v1::DT_FLOAT32, {rows, width},
                         storage.back()});
    }
  }
  int64_t step;
  {
    absl::MutexLock c(&clock_mu_);
    step = clocks_.Min();
  }
  auto bytes = EncodeSafetensors(
      tensors, {{"pscluster.job_id", id()}, {"pscluster.step", absl::StrCat(step)}});
  if (!bytes.ok()) return bytes.status();
  return std::make_pair(std::move(*bytes), static_cast<uint32_t>(tensors.size()));
}

absl::StatusOr<bool> Job::ListKeys(const std::string& table, uint64_t epoch, uint64_t start,
                                   size_t limit, std::vector<uint64_t>* keys) {
  if (dropped_) return absl::NotFoundError(absl::StrCat("job_id: job '", id(), "' was dropped"));
  absl::MutexLock l(&state_mu_);  // Exclusive: no row moves between the tiers meanwhile.
  absl::Status e = CheckEpoch(epoch, "epoch");
  if (!e.ok()) return e;
  auto it = table_index_.find(table);
  if (it == table_index_.end()) {
    return absl::NotFoundError(
        absl::StrCat("table: unknown table '", table, "' in job '", id(), "'"));
  }
  const TableState& t = tables_[it->second];
  if (t.sparse == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table: '", table, "' is a dense table; only a sparse table's keys are listed"));
  }
  return t.sparse->ListKeys(start, limit, held_, keys);
}

void Job::NoteCheckpoint(const std::string& path, absl::Time when) {
  absl::MutexLock c(&clock_mu_);
  last_checkpoint_ = path;
  last_checkpoint_time_ = when;
}

}  // namespace pscluster
