// A ParamClient without servers or sockets, for tests of what uses one (the worker's trainer,
// step pipeline, evaluator and exporter): FakeParamClients of one job's ranks share a
// FakeParameterStore in this process, which keeps each table whole and applies pushes with the
// servers' own initializers and update rules (server/initializer.h, server/optimizer.h), so a
// task trained against it learns. Tests make calls fail on demand, hold pulls, and read back
// what was pushed.
//
// What the store does not do, and refuses where a table asks for it (UNIMPLEMENTED naming the
// table): compression, embedding admission and expiry, aggregated BSP steps. Pulls never wait for
// other workers (every consistency mode behaves as ASP): use one rank, or tests where the order
// of ranks does not matter.
//
// Thread model: the store and its clients may be used from any number of threads.
#ifndef PSCLUSTER_SERVER_CLIENT_TESTING_FAKE_PARAM_CLIENT_H_
#define PSCLUSTER_SERVER_CLIENT_TESTING_FAKE_PARAM_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/client/param_client.h"
#include "server/initializer.h"
#include "server/optimizer.h"

namespace pscluster {

class FakeParamClient;

class FakeParameterStore {
 public:
  enum class Call { kPull, kPush, kPushPull };

  // One applied push, in the order they were applied.
  struct Pushed {
    uint32_t worker = 0;
    int64_t step = 0;
    bool end_of_step = true;
  };

  FakeParameterStore() = default;
  FakeParameterStore(const FakeParameterStore&) = delete;
  FakeParameterStore& operator=(const FakeParameterStore&) = delete;

  // After the next `after` calls of `call` (of any client) succeed, the `times` calls after
  // them fail with `status` and change nothing (replacing what was queued for `call`).
  void FailNext(Call call, absl::Status status, int times = 1, int after = 0);
  // The next call of `call` is carried out, then fails with `status` (as if its reply was lost).
  void FailAfterApplying(Call call, absl::Status status);
  // While held, pulls (and push-pulls, after their push) wait until Release() or until their
  // client is cancelled (CANCELLED).
  void HoldPulls();
  void ReleasePulls();
  // Waits until at least `n` pulls are held; false after `timeout`.
  bool WaitForHeldPulls(int n, absl::Duration timeout);

  // What the clients did.
  std::vector<Pushed> pushes() const;
  uint64_t duplicate_pushes() const;  // Pushes whose tag had been applied already.
  std::vector<int64_t> pull_clocks(uint32_t worker) const;
  int install_calls() const;
  bool created() const;
  v1::ConsistencySpec consistency() const;
  uint32_t num_workers() const;

  // A dense table's values (empty when there is no such table).
  std::vector<float> Dense(const std::string& table) const;
  // A sparse table's stored row (nullopt: the key has no row; pulls read the initializer).
  std::optional<std::vector<float>> Row(const std::string& table, uint64_t key) const;
  size_t rows(const std::string& table) const;

 private:
  friend class FakeParamClient;

  struct Table {
    v1::TableSpec spec;
    std::unique_ptr<Initializer> init;
    OptimizerParams opt;
    uint64_t elems = 0;                // Dense.
    std::vector<float> values, slots;  // Dense: elems; slots: num_slots() * elems.
    int64_t updates = 0;               // Dense: pushes applied.
    struct Row {
      std::vector<float> values, slots;
      int64_t updates = 0;
    };
    absl::flat_hash_map<uint64_t, Row> rows;  // Sparse.
  };

  absl::Status Create(const std::vector<v1::TableSpec>& tables,
                      const v1::ConsistencySpec& consistency, uint32_t num_workers);
  void Install();
  struct Outcome {
    absl::Status status;  // OK: the call goes ahead.
    bool applied = false;  // The call is carried out before it fails.
  };
  // The outcome queued for the next call of `call` (OK: none).
  Outcome TakeOutcome(Call call);
  absl::Status DoPull(const FakeParamClient& client, int64_t clock, const PullTargets& targets);
  absl::Status DoPush(uint32_t worker, int64_t step, uint64_t seq, bool end_of_step,
                      const PushSources& sources);
  absl::StatusOr<std::vector<uint64_t>> DoListKeys(const std::string& table,
                                                   uint64_t max_keys) const;
  void Wake();  // A client was cancelled: held pulls look again.

  absl::Status CheckTargets(const PullTargets& targets) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  bool created_ ABSL_GUARDED_BY(mu_) = false;
  v1::ConsistencySpec consistency_ ABSL_GUARDED_BY(mu_);
  uint32_t num_workers_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Table> tables_ ABSL_GUARDED_BY(mu_);
  // Per call: the outcomes of the next calls, in order (OK: goes ahead).
  std::map<Call, std::deque<Outcome>> failures_ ABSL_GUARDED_BY(mu_);
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t wakes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<std::tuple<uint32_t, int64_t, uint64_t>> applied_ ABSL_GUARDED_BY(mu_);
  std::vector<Pushed> pushes_ ABSL_GUARDED_BY(mu_);
  uint64_t duplicates_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, std::vector<int64_t>> pull_clocks_ ABSL_GUARDED_BY(mu_);
  int install_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

class FakeParamClient final : public ParamClient {
 public:
  // Rank `worker` of the job whose `tables` the store holds (once CreateTables declared them).
  FakeParamClient(std::shared_ptr<FakeParameterStore> store, uint32_t worker, v1::ShardMap map,
                  std::vector<v1::TableSpec> tables);

  using ParamClient::CreateTables;
  // Declares the tables in the store (idempotent; different specs for a declared table are
  // FAILED_PRECONDITION). checkpoint_every_steps > 0 is UNIMPLEMENTED.
  absl::Status CreateTables(const v1::ConsistencySpec& consistency, uint32_t num_workers,
                            uint32_t checkpoint_every_steps,
                            const std::string& checkpoint_dir) override;
  absl::Status InstallShardMap() override;
  absl::Status SetShardMap(v1::ShardMap map) override;
  v1::ShardMap shard_map() const override;
  absl::Status Pull(int64_t clock, const PullTargets& targets) override;
  using ParamClient::Push;
  absl::Status Push(int64_t step, const PushSources& sources, bool end_of_step) override;
  absl::Status PushPull(int64_t step, const PushSources& sources,
                        const PullTargets& targets) override;
  // The keys with a stored row, as the servers list them (FAILED_PRECONDITION before
  // CreateTables; INVALID_ARGUMENT for a table that is not a sparse table of the store).
  absl::StatusOr<std::vector<uint64_t>> ListKeys(const std::string& table,
                                                 uint64_t max_keys) override;
  void Cancel() override;
  Stats stats() const override;

  bool cancelled() const { return cancelled_.load(); }
  uint32_t worker() const { return worker_; }

 private:
  // The tag of this push of `step`: a push repeated after a failure reuses the failed one's.
  uint64_t SeqFor(int64_t step);
  void Settle(int64_t step, bool ok);

  const std::shared_ptr<FakeParameterStore> store_;
  const uint32_t worker_;
  const std::vector<v1::TableSpec> tables_;
  std::atomic<bool> cancelled_{false};
  std::atomic<uint64_t> calls_{0};
  mutable absl::Mutex mu_;
  v1::ShardMap map_ ABSL_GUARDED_BY(mu_);
  // Per step: the next push's sequence number, and the failed push's to repeat (if any).
  std::map<int64_t, std::pair<uint64_t, std::optional<uint64_t>>> seqs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_TESTING_FAKE_PARAM_CLIENT_H_
