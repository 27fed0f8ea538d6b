// One worker's training task, put together from its parts: the data it reads (training_data.h),
// the backend and model (kernels/), the parameter-server client, the step loop
// (step_pipeline.h: pull -> compute -> push, overlapped as the consistency model allows), the
// progress it reports (progress_reporter.h), test-set evaluation after each epoch by the lead
// rank (evaluator.h) and the model exported at the end (model_export.h, safetensors).
//
// Thread model: Run() on the task thread (it owns the model, backend, data and client; the
// pusher thread only reads a finished gradient slot); Cancel(), UpdateShardMap() and Snapshot()
// from any thread.
#ifndef PSCLUSTER_WORKER_TRAINER_H_
#define PSCLUSTER_WORKER_TRAINER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "common/file_system.h"
#include "proto/worker.pb.h"
#include "server/client/param_client.h"
#include "server/client/ps_client.h"
#include "worker/task_data.h"
#include "worker/task_runner.h"

namespace pscluster::worker {

// Makes the client of the parameter servers a task uses (its options, the task's shard map, the
// job's tables). The default is PsClient::Create; tests give a FakeParamClient.
using ParamClientFactory = std::function<absl::StatusOr<std::unique_ptr<ParamClient>>(
    const PsClientOptions& options, const v1::ShardMap& map,
    const std::vector<v1::TableSpec>& tables)>;

// PsClient::Create, as a ParamClientFactory.
absl::StatusOr<std::unique_ptr<ParamClient>> CreatePsClient(const PsClientOptions& options,
                                                            const v1::ShardMap& map,
                                                            const std::vector<v1::TableSpec>& tables);

struct TrainerOptions {
  // Backend when the job leaves it to the worker (JobSpec.device empty or "auto"):
  // "auto", "cuda", "cuda:N" or "cpu".
  std::string device = "auto";
  int cpu_threads = 0;                  // CPU backend threads; 0 = all cores.
  DataDirs data_dirs;
  ChannelOptions channel;               // TLS to the servers.
  // Every export (the job's export_path, psctl export --to) must lie in this directory (a
  // resolved --export_root, common/path_root.h); empty = anywhere.
  std::string export_root;
  // Data plane to the servers (auto: their Unix socket on this host, else their TCP data port,
  // in TLS when the channel has TLS).
  DataTransport data_transport = DataTransport::kAuto;
  // TCP data plane: how long a waiting thread checks the socket before it sleeps.
  absl::Duration data_spin = absl::Microseconds(50);
  // Unix data socket: shared memory rings of this size for the payloads (0: none).
  size_t data_shm_ring_bytes = 16 << 20;
  // Deadline of each pull/push (waiting for slow workers under BSP/SSP included).
  absl::Duration call_timeout = absl::Seconds(120);
  // Send the shard map to the servers before creating tables (standalone runs, with no
  // scheduler to do it).
  bool install_shard_map = false;
  absl::Duration report_interval = absl::Seconds(1);
  // Evaluate on the test set after each epoch (rank 0 only); the final evaluation always runs.
  bool eval_every_epoch = true;
  // Histograms of the pull, push and push-pull calls' durations (the daemon's /metrics); shared
  // by every task of the worker. Null members: not observed.
  std::shared_ptr<const CallLatency> call_latency;
  // The task's client of the parameter servers, and the one an on-demand export makes.
  ParamClientFactory param_client_factory = CreatePsClient;
  // Where exports are written (tests inject one that fails or crashes). REQUIRES: outlives the
  // trainer and every on-demand export it prepared.
  FileSystem* export_fs = FileSystem::Default();
};

struct TrainerResult {
  int64_t steps = 0;
  double test_accuracy = -1;
  double test_loss = -1;
  double test_auc = -1;  // Two-class models.
  double train_loss = 0;          // Last reporting window.
  double samples_per_sec = 0;     // Training examples per second of the step loop (evaluation
                                  // and export excluded).
  double train_sec = 0;           // Time in the step loop.
  // When the first epoch's step loop began and the last one's ended (evaluation between epochs
  // falls inside; benchmarks read the machine's CPU use over this window).
  absl::Time train_start, train_end;
  double pull_wait_sec = 0;
  double compute_sec = 0;
  double push_wait_sec = 0;
  // The parameter-server client's own account (ParamClient::Stats) of the data-plane calls.
  double client_plan_sec = 0, client_send_sec = 0, client_wait_sec = 0, client_copy_sec = 0;
  std::string export_path;
  std::string device;
};

class Trainer final : public TaskRunner {
 public:
  // Validates the task; cheap (data is loaded by Run()). REQUIRES: sink outlives the trainer.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const v1::AssignTaskRequest& task,
                                                         const TrainerOptions& options,
                                                         ProgressSink* sink);
  ~Trainer() override;

  absl::Status Run() override;
  void Cancel(absl::string_view reason) override;
  void UpdateShardMap(const v1::ShardMap& map) override;
  absl::Status UpdatePartition(const v1::UpdatePartitionRequest& update) override;
  TaskSnapshot Snapshot() const override;
  // The model as the servers hold it at this rank's step, written to `path` by a client of its
  // own (psctl export). FAILED_PRECONDITION until the task's tables exist, or once it ended.
  absl::StatusOr<ExportFn> PrepareExport(const std::string& path) override;

  // Valid after Run() returned OK.
  TrainerResult result() const;

 private:
  Trainer(v1::AssignTaskRequest task, TrainerOptions options, ProgressSink* sink)
      : task_(std::move(task)), options_(std::move(options)), sink_(sink) {
    lead_rank_.store(task_.lead_rank());
  }
  struct State;
  struct ExportContext;  // What an on-demand export needs, set once the tables exist.
  class StoppingSink;
  absl::Status RunImpl(State* st);

  const v1::AssignTaskRequest task_;
  const TrainerOptions options_;
  ProgressSink* const sink_;

  std::atomic<bool> cancelled_{false};
  mutable absl::Mutex mu_;
  std::string cancel_reason_ ABSL_GUARDED_BY(mu_);
  ParamClient* client_ ABSL_GUARDED_BY(mu_) = nullptr;  // Valid while Run() runs.
  TaskSnapshot snapshot_ ABSL_GUARDED_BY(mu_);
  TrainerResult result_ ABSL_GUARDED_BY(mu_);
  // Set by UpdatePartition, taken by the training loop before its next batch.
  std::optional<v1::DataPartition> new_partition_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint32_t> lead_rank_{0};
  std::shared_ptr<const ExportContext> export_ctx_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_TRAINER_H_
