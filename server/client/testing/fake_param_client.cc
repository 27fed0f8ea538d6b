#include "server/client/testing/fake_param_client.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace pscluster {

// ---------------------------------------------------------------------------------------------
// FakeParameterStore

void FakeParameterStore::FailNext(Call call, absl::Status status, int times, int after) {
  absl::MutexLock l(&mu_);
  std::deque<Outcome>& q = failures_[call];
  q.clear();
  for (int i = 0; i < after; ++i) q.push_back(Outcome{});
  for (int i = 0; i < times; ++i) q.push_back(Outcome{status, false});
}

void FakeParameterStore::FailAfterApplying(Call call, absl::Status status) {
  absl::MutexLock l(&mu_);
  std::deque<Outcome>& q = failures_[call];
  q.clear();
  q.push_back(Outcome{std::move(status), true});
}

void FakeParameterStore::HoldPulls() {
  absl::MutexLock l(&mu_);
  hold_ = true;
}

void FakeParameterStore::ReleasePulls() {
  absl::MutexLock l(&mu_);
  hold_ = false;
}

bool FakeParameterStore::WaitForHeldPulls(int n, absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return held_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

void FakeParameterStore::Wake() {
  absl::MutexLock l(&mu_);
  ++wakes_;
}

std::vector<FakeParameterStore::Pushed> FakeParameterStore::pushes() const {
  absl::MutexLock l(&mu_);
  return pushes_;
}

uint64_t FakeParameterStore::duplicate_pushes() const {
  absl::MutexLock l(&mu_);
  return duplicates_;
}

std::vector<int64_t> FakeParameterStore::pull_clocks(uint32_t worker) const {
  absl::MutexLock l(&mu_);
  auto it = pull_clocks_.find(worker);
  return it == pull_clocks_.end() ? std::vector<int64_t>{} : it->second;
}

int FakeParameterStore::install_calls() const {
  absl::MutexLock l(&mu_);
  return install_calls_;
}

bool FakeParameterStore::created() const {
  absl::MutexLock l(&mu_);
  return created_;
}

v1::ConsistencySpec FakeParameterStore::consistency() const {
  absl::MutexLock l(&mu_);
  return consistency_;
}

uint32_t FakeParameterStore::num_workers() const {
  absl::MutexLock l(&mu_);
  return num_workers_;
}

std::vector<float> FakeParameterStore::Dense(const std::string& table) const {
  absl::MutexLock l(&mu_);
  auto it = tables_.find(table);
  if (it == tables_.end() || it->second.spec.kind() != v1::DENSE) return {};
  return it->second.values;
}

std::optional<std::vector<float>> FakeParameterStore::Row(const std::string& table,
                                                          uint64_t key) const {
  absl::MutexLock l(&mu_);
  auto it = tables_.find(table);
  if (it == tables_.end()) return std::nullopt;
  auto row = it->second.rows.find(key);
  if (row == it->second.rows.end()) return std::nullopt;
  return row->second.values;
}

size_t FakeParameterStore::rows(const std::string& table) const {
  absl::MutexLock l(&mu_);
  auto it = tables_.find(table);
  return it == tables_.end() ? 0 : it->second.rows.size();
}

absl::Status FakeParameterStore::Create(const std::vector<v1::TableSpec>& tables,
                                        const v1::ConsistencySpec& consistency,
                                        uint32_t num_workers) {
  if (consistency.aggregate()) {
    return absl::UnimplementedError("consistency.aggregate: the fake store applies each push");
  }
  if (num_workers == 0) return absl::InvalidArgumentError("num_workers: must be >= 1");
  std::map<std::string, Table> made;
  for (size_t i = 0; i < tables.size(); ++i) {
    const v1::TableSpec& spec = tables[i];
    const std::string field = absl::StrCat("tables[", i, "] ('", spec.name(), "')");
    if (spec.compression().ByteSizeLong() != 0) {
      return absl::UnimplementedError(
          absl::StrCat(field, ".compression: the fake store does not compress"));
    }
    if (spec.embedding().ByteSizeLong() != 0) {
      return absl::UnimplementedError(
          absl::StrCat(field, ".embedding: the fake store has no admission or expiry"));
    }
    absl::Status init = ValidateInitializer(spec, absl::StrCat(field, ".init"));
    if (!init.ok()) return init;
    auto opt = ResolveOptimizer(spec.optimizer(), absl::StrCat(field, ".optimizer"));
    if (!opt.ok()) return opt.status();
    Table t;
    t.spec = spec;
    t.init = std::make_unique<Initializer>(spec);
    t.opt = *opt;
    if (spec.kind() == v1::DENSE) {
      if (spec.shape().dims().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".shape: empty"));
      }
      t.elems = 1;
      for (uint64_t d : spec.shape().dims()) t.elems *= d;
      t.values.resize(t.elems);
      t.init->FillDense(0, t.elems, t.values.data());
      t.slots.resize(static_cast<size_t>(t.opt.num_slots()) * t.elems);
      InitSlots(t.opt, t.slots.data(), t.elems);
    } else if (spec.row_width() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".row_width: must be > 0"));
    }
    if (!made.emplace(spec.name(), std::move(t)).second) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": declared twice"));
    }
  }
  absl::MutexLock l(&mu_);
  if (created_) {
    // Idempotent for the same tables; another rank's different declaration is refused.
    for (const auto& [name, t] : made) {
      auto it = tables_.find(name);
      if (it == tables_.end() || it->second.spec.SerializeAsString() != t.spec.SerializeAsString()) {
        return absl::FailedPreconditionError(
            absl::StrCat("table '", name, "' differs from the one already declared"));
      }
    }
    if (made.size() != tables_.size()) {
      return absl::FailedPreconditionError("the tables differ from the ones already declared");
    }
    return absl::OkStatus();
  }
  tables_ = std::move(made);
  consistency_ = consistency;
  num_workers_ = num_workers;
  created_ = true;
  return absl::OkStatus();
}

void FakeParameterStore::Install() {
  absl::MutexLock l(&mu_);
  ++install_calls_;
}

FakeParameterStore::Outcome FakeParameterStore::TakeOutcome(Call call) {
  absl::MutexLock l(&mu_);
  auto it = failures_.find(call);
  if (it == failures_.end() || it->second.empty()) return Outcome{};
  Outcome o = std::move(it->second.front());
  it->second.pop_front();
  return o;
}

absl::Status FakeParameterStore::CheckTargets(const PullTargets& targets) const {
  if (!created_) return absl::FailedPreconditionError("the job's tables were not created");
  for (const DenseTarget& d : targets.dense) {
    auto it = tables_.find(d.table);
    if (it == tables_.end() || it->second.spec.kind() != v1::DENSE) {
      return absl::NotFoundError(absl::StrCat("no dense table '", d.table, "'"));
    }
  }
  for (const SparseTarget& s : targets.sparse) {
    auto it = tables_.find(s.table);
    if (it == tables_.end() || it->second.spec.kind() != v1::SPARSE) {
      return absl::NotFoundError(absl::StrCat("no sparse table '", s.table, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status FakeParameterStore::DoPull(const FakeParamClient& client, int64_t clock,
                                        const PullTargets& targets) {
  absl::MutexLock l(&mu_);
  if (hold_) {
    ++held_;
    auto go = [this, &client]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !hold_ || client.cancelled();
    };
    // Cancel() bumps wakes_ under the lock, which makes the condition be evaluated again.
    mu_.Await(absl::Condition(&go));
    --held_;
  }
  if (client.cancelled()) return absl::CancelledError("cancelled");
  absl::Status ok = CheckTargets(targets);
  if (!ok.ok()) return ok;
  pull_clocks_[client.worker()].push_back(clock);
  for (const DenseTarget& d : targets.dense) {
    const Table& t = tables_.at(d.table);
    std::memcpy(d.data, t.values.data(), t.elems * sizeof(float));
  }
  for (const SparseTarget& s : targets.sparse) {
    const Table& t = tables_.at(s.table);
    const size_t w = t.spec.row_width();
    for (size_t i = 0; i < s.keys.size(); ++i) {
      float* out = s.rows + i * w;
      auto row = t.rows.find(s.keys[i]);
      if (row != t.rows.end()) {
        std::memcpy(out, row->second.values.data(), w * sizeof(float));
      } else {
        t.init->FillRow(s.keys[i], w, out);  // Reads never create rows.
      }
    }
  }
  return absl::OkStatus();
}

absl::Status FakeParameterStore::DoPush(uint32_t worker, int64_t step, uint64_t seq,
                                        bool end_of_step, const PushSources& sources) {
  absl::MutexLock l(&mu_);
  if (!created_) return absl::FailedPreconditionError("the job's tables were not created");
  for (const DenseSource& d : sources.dense) {
    auto it = tables_.find(d.table);
    if (it == tables_.end() || it->second.spec.kind() != v1::DENSE) {
      return absl::NotFoundError(absl::StrCat("no dense table '", d.table, "'"));
    }
  }
  for (const SparseSource& s : sources.sparse) {
    auto it = tables_.find(s.table);
    if (it == tables_.end() || it->second.spec.kind() != v1::SPARSE) {
      return absl::NotFoundError(absl::StrCat("no sparse table '", s.table, "'"));
    }
  }
  if (!applied_.insert({worker, step, seq}).second) {
    ++duplicates_;
    return absl::OkStatus();
  }
  pushes_.push_back(Pushed{worker, step, end_of_step});
  for (const DenseSource& d : sources.dense) {
    Table& t = tables_.at(d.table);
    const OptimizerParams p = AtStep(t.opt, step);
    float* s0 = t.opt.num_slots() >= 1 ? t.slots.data() : nullptr;
    float* s1 = t.opt.num_slots() >= 2 ? t.slots.data() + t.elems : nullptr;
    ApplyUpdate(p, ++t.updates, t.elems, d.grad, t.values.data(), s0, s1);
  }
  for (const SparseSource& s : sources.sparse) {
    Table& t = tables_.at(s.table);
    const OptimizerParams p = AtStep(t.opt, step);
    const size_t w = t.spec.row_width();
    // Duplicate keys add up, then each row is updated once.
    absl::flat_hash_map<uint64_t, size_t> at;  // Key -> its sum's index in `sums`.
    std::vector<float> sums;
    std::vector<uint64_t> order;
    for (size_t i = 0; i < s.keys.size(); ++i) {
      auto [it, fresh] = at.try_emplace(s.keys[i], order.size());
      if (fresh) {
        order.push_back(s.keys[i]);
        sums.resize(sums.size() + w, 0.f);
      }
      float* sum = sums.data() + it->second * w;
      for (size_t j = 0; j < w; ++j) sum[j] += s.grads[i * w + j];
    }
    for (size_t k = 0; k < order.size(); ++k) {
      const uint64_t key = order[k];
      const float* g = sums.data() + k * w;
      auto [row, fresh] = t.rows.try_emplace(key);
      if (fresh) {
        row->second.values.resize(w);
        t.init->FillRow(key, w, row->second.values.data());
        row->second.slots.resize(static_cast<size_t>(t.opt.num_slots()) * w);
        InitSlots(t.opt, row->second.slots.data(), w);
      }
      float* s0 = t.opt.num_slots() >= 1 ? row->second.slots.data() : nullptr;
      float* s1 = t.opt.num_slots() >= 2 ? row->second.slots.data() + w : nullptr;
      ApplyUpdate(p, ++row->second.updates, w, g, row->second.values.data(), s0, s1);
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// FakeParamClient

absl::StatusOr<std::vector<uint64_t>> FakeParameterStore::DoListKeys(const std::string& table,
                                                                     uint64_t max_keys) const {
  absl::MutexLock l(&mu_);
  if (!created_) return absl::FailedPreconditionError("no tables yet (CreateTables first)");
  auto it = tables_.find(table);
  if (it == tables_.end() || it->second.spec.kind() != v1::SPARSE) {
    return absl::InvalidArgumentError(absl::StrCat("table: '", table, "' is not a sparse table"));
  }
  if (it->second.rows.size() > max_keys) {
    return absl::ResourceExhaustedError(
        absl::StrCat("table '", table, "' holds more than ", max_keys, " keys"));
  }
  std::vector<uint64_t> keys;
  keys.reserve(it->second.rows.size());
  for (const auto& [key, row] : it->second.rows) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

FakeParamClient::FakeParamClient(std::shared_ptr<FakeParameterStore> store, uint32_t worker,
                                 v1::ShardMap map, std::vector<v1::TableSpec> tables)
    : store_(std::move(store)), worker_(worker), tables_(std::move(tables)),
      map_(std::move(map)) {}

absl::Status FakeParamClient::CreateTables(const v1::ConsistencySpec& consistency,
                                           uint32_t num_workers, uint32_t checkpoint_every_steps,
                                           const std::string& checkpoint_dir) {
  if (checkpoint_every_steps > 0 || !checkpoint_dir.empty()) {
    return absl::UnimplementedError("checkpoint_every_steps: the fake store keeps no checkpoints");
  }
  if (cancelled()) return absl::CancelledError("cancelled");
  return store_->Create(tables_, consistency, num_workers);
}

absl::Status FakeParamClient::InstallShardMap() {
  if (cancelled()) return absl::CancelledError("cancelled");
  store_->Install();
  return absl::OkStatus();
}

absl::Status FakeParamClient::SetShardMap(v1::ShardMap map) {
  absl::MutexLock l(&mu_);
  if (map.job_id() != map_.job_id()) {
    return absl::InvalidArgumentError(absl::StrCat("shard map of job '", map.job_id(),
                                                   "', not '", map_.job_id(), "'"));
  }
  if (map.epoch() > map_.epoch()) map_ = std::move(map);
  return absl::OkStatus();
}

v1::ShardMap FakeParamClient::shard_map() const {
  absl::MutexLock l(&mu_);
  return map_;
}

uint64_t FakeParamClient::SeqFor(int64_t step) {
  absl::MutexLock l(&mu_);
  auto& [next, failed] = seqs_[step];
  if (failed.has_value()) return *failed;
  return next++;
}

void FakeParamClient::Settle(int64_t step, bool ok) {
  absl::MutexLock l(&mu_);
  auto& [next, failed] = seqs_[step];
  if (ok) {
    failed.reset();
  } else if (!failed.has_value()) {
    failed = next - 1;
  }
}

absl::Status FakeParamClient::Pull(int64_t clock, const PullTargets& targets) {
  if (cancelled()) return absl::CancelledError("cancelled");
  const FakeParameterStore::Outcome o = store_->TakeOutcome(FakeParameterStore::Call::kPull);
  if (!o.status.ok() && !o.applied) return o.status;
  absl::Status s = store_->DoPull(*this, clock, targets);
  if (!o.status.ok()) return o.status;
  if (s.ok()) ++calls_;
  return s;
}

absl::Status FakeParamClient::Push(int64_t step, const PushSources& sources, bool end_of_step) {
  if (cancelled()) return absl::CancelledError("cancelled");
  const uint64_t seq = SeqFor(step);
  const FakeParameterStore::Outcome o = store_->TakeOutcome(FakeParameterStore::Call::kPush);
  absl::Status s = o.status;
  if (o.status.ok() || o.applied) s.Update(store_->DoPush(worker_, step, seq, end_of_step, sources));
  Settle(step, s.ok());
  if (s.ok()) ++calls_;
  return s;
}

absl::Status FakeParamClient::PushPull(int64_t step, const PushSources& sources,
                                       const PullTargets& targets) {
  if (cancelled()) return absl::CancelledError("cancelled");
  const uint64_t seq = SeqFor(step);
  const FakeParameterStore::Outcome o = store_->TakeOutcome(FakeParameterStore::Call::kPushPull);
  absl::Status s = o.status;
  if (o.status.ok() || o.applied) s.Update(store_->DoPush(worker_, step, seq, true, sources));
  Settle(step, s.ok());
  if (!s.ok()) return s;
  s = store_->DoPull(*this, step + 1, targets);
  if (s.ok()) ++calls_;
  return s;
}

absl::StatusOr<std::vector<uint64_t>> FakeParamClient::ListKeys(const std::string& table,
                                                                uint64_t max_keys) {
  if (cancelled()) return absl::CancelledError("cancelled");
  return store_->DoListKeys(table, max_keys);
}

void FakeParamClient::Cancel() {
  cancelled_.store(true);
  store_->Wake();
}

ParamClient::Stats FakeParamClient::stats() const {
  Stats s;
  s.calls = calls_.load();
  return s;
}

}  // namespace pscluster
