#include "worker/trainer.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/path_root.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "server/client/ps_client.h"
#include "worker/evaluator.h"
#include "worker/data/dataset_spec.h"
#include "worker/in_memory_data.h"
#include "worker/model_export.h"
#include "worker/param_slots.h"
#include "worker/progress_reporter.h"
#include "worker/step_pipeline.h"
#include "worker/streamed_data.h"
#include "worker/tables.h"
#include "worker/training_data.h"

namespace pscluster::worker {
namespace {

constexpr int kDefaultEvalBatch = 1000;

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// Whether the job itself picks the CPU backend (not the worker's --device for an open choice).
bool JobAsksForCpu(const v1::JobSpec& spec) {
  return spec.device() == "cpu" ||
         ((spec.device().empty() || spec.device() == "auto") && spec.gpus_per_worker() == 0);
}

// Which backend the task uses: the job's explicit choice, else CPU for jobs that ask for no GPU,
// else the worker's own --device.
std::string EffectiveDevice(const v1::JobSpec& spec, const std::string& worker_device) {
  if (!spec.device().empty() && spec.device() != "auto") return spec.device();
  if (spec.gpus_per_worker() == 0) return "cpu";
  return worker_device;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParamClient>> CreatePsClient(
    const PsClientOptions& options, const v1::ShardMap& map,
    const std::vector<v1::TableSpec>& tables) {
  auto client = PsClient::Create(options, map, tables);
  if (!client.ok()) return client.status();
  return std::unique_ptr<ParamClient>(std::move(*client));
}

// Forwards a task's reports; one the scheduler answers with "stop" cancels the task.
class Trainer::StoppingSink final : public ProgressSink {
 public:
  explicit StoppingSink(Trainer* t) : t_(t) {}
  bool Report(const v1::WorkerProgress& progress) override {
    if (t_->sink_->Report(progress)) return true;
    t_->Cancel("the scheduler stopped the job");
    return false;
  }
  absl::StatusOr<v1::ShardMap> RefreshShardMap() override { return t_->sink_->RefreshShardMap(); }

 private:
  Trainer* const t_;
};

// Everything Run() builds, owned by the task thread.
struct Trainer::State {
  std::unique_ptr<TaskData> data;          // A built-in data set, in memory.
  std::unique_ptr<StreamedData> streamed;  // Or the user's files, streamed.
  std::unique_ptr<TrainSource> train;
  std::unique_ptr<TestSource> test;
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<kernels::Model> model;
  std::vector<v1::TableSpec> tables;
  std::unique_ptr<ParamClient> client;
};

struct Trainer::ExportContext {
  ParamClientFactory factory;
  FileSystem* fs = nullptr;
  PsClientOptions client;
  std::vector<v1::TableSpec> tables;
  std::vector<kernels::ParamInfo> params;
  std::vector<uint64_t> sparse_keys;
  // The sparse tables are written at the keys the servers list (a graph model over the user's
  // keys) instead of sparse_keys.
  bool list_keys = false;
  std::string model_kind;
};

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const v1::AssignTaskRequest& task,
                                                         const TrainerOptions& options,
                                                         ProgressSink* sink) {
  const v1::JobSpec& spec = task.spec();
  if (!options.param_client_factory) {
    return absl::InvalidArgumentError("TrainerOptions.param_client_factory: unset");
  }
  if (options.export_fs == nullptr) {
    return absl::InvalidArgumentError("TrainerOptions.export_fs: null");
  }
  if (spec.batch_size() == 0 || spec.batch_size() > (1u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.batch_size: ", spec.batch_size(), " is not in [1, 1048576]"));
  }
  if (spec.epochs() == 0) return absl::InvalidArgumentError("spec.epochs: must be >= 1");
  if (spec.model().kind().empty()) return absl::InvalidArgumentError("spec.model.kind: missing");
  if (spec.dataset().name().empty() && !data::IsStreamed(spec.dataset())) {
    return absl::InvalidArgumentError(
        "spec.dataset: neither a built-in data set (name) nor the user's files (format)");
  }
  if (task.start_step() < 0) return absl::InvalidArgumentError("start_step: must be >= 0");
  if (task.training_ranks() > task.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("training_ranks: ", task.training_ranks(),
                                                   " is above num_workers ", task.num_workers()));
  }
  if (task.lead_rank() >= std::max(1u, task.num_workers())) {
    return absl::InvalidArgumentError(absl::StrCat("lead_rank: ", task.lead_rank(),
                                                   " is not below num_workers ",
                                                   task.num_workers()));
  }
  return std::unique_ptr<Trainer>(new Trainer(task, options, sink));
}

Trainer::~Trainer() = default;

void Trainer::Cancel(absl::string_view reason) {
  absl::MutexLock l(&mu_);
  if (cancel_reason_.empty()) cancel_reason_ = std::string(reason);
  cancelled_.store(true);
  // Pulls parked behind slower workers and pushes in flight return now, not at their deadline.
  if (client_ != nullptr) client_->Cancel();
}

void Trainer::UpdateShardMap(const v1::ShardMap& map) {
  absl::MutexLock l(&mu_);
  if (client_ == nullptr) return;
  absl::Status s = client_->SetShardMap(map);
  if (!s.ok()) Logger("worker")->warn("shard map update: {}", s);
  snapshot_.shard_map_epoch = client_->shard_map().epoch();
}

absl::Status Trainer::UpdatePartition(const v1::UpdatePartitionRequest& update) {
  const v1::DataPartition& partition = update.partition();
  const uint32_t lead_rank = update.lead_rank();
  const data::PartitionSpec now = PartitionSpecOf(task_.partition(), task_.rank(),
                                                  task_.num_workers());
  const data::PartitionSpec next = PartitionSpecOf(partition, task_.rank(), task_.num_workers());
  if (next.index != now.index || next.count != now.count || next.begin != now.begin ||
      next.end != now.end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partition: part ", next.index, " of ", next.count, " is not this task's (part ",
        now.index, " of ", now.count, "); only `also` and `shares` may change"));
  }
  // The same checks as when the data is cut (they do not depend on its size).
  absl::Status extra = data::CheckPartition(next);
  if (!extra.ok()) return extra;
  if (lead_rank >= task_.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("lead_rank: ", lead_rank, " is not below ",
                                                   task_.num_workers()));
  }
  if (update.training_ranks() > task_.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("training_ranks: ", update.training_ranks(),
                                                   " is above num_workers ",
                                                   task_.num_workers()));
  }
  absl::MutexLock l(&mu_);
  new_partition_ = partition;
  lead_rank_.store(lead_rank);
  return absl::OkStatus();
}

absl::StatusOr<TaskRunner::ExportFn> Trainer::PrepareExport(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("path: empty output path");
  absl::Status in_root = CheckUnderRoot(path, options_.export_root, "path");
  if (!in_root.ok()) return in_root;
  absl::MutexLock l(&mu_);
  if (client_ == nullptr || export_ctx_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", task_.job_id(), " rank ", task_.rank(),
        ": the task is not training (its tables are not created yet, or it ended)"));
  }
  std::shared_ptr<const ExportContext> ctx = export_ctx_;
  for (const kernels::ParamInfo& p : ctx->params) {
    if (p.sparse && ctx->sparse_keys.empty() && !ctx->list_keys) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", task_.job_id(), ": sparse table ", p.name,
          " has no keys to export (only sparse_linear jobs submitted with an export_path "
          "export their sparse tables)"));
    }
  }
  v1::ShardMap map = client_->shard_map();
  const int64_t step = snapshot_.step;
  const std::string job_id = task_.job_id();
  return ExportFn([ctx, map, step, job_id, path]() -> absl::StatusOr<v1::ExportModelResponse> {
    absl::Status ds = ExportDirReady(path, "", "export_path", ctx->fs);
    if (!ds.ok()) return ds;
    auto client = ctx->factory(ctx->client, map, ctx->tables);
    if (!client.ok()) return client.status();
    std::map<std::string, std::string> meta = {{"job_id", job_id},
                                               {"model", ctx->model_kind},
                                               {"steps", absl::StrCat(step)},
                                               {"producer", "pscluster"}};
    // At this rank's step: the pull waits until every rank has pushed it.
    auto written =
        ctx->list_keys
            ? ExportListed(ctx->params, client->get(), step, path, meta, ctx->fs, "path")
            : ExportParams(ctx->params, client->get(), step, ctx->sparse_keys, path, meta, ctx->fs);
    if (!written.ok()) return written.status();
    Logger("worker")->info("job {}: model at step {} exported on demand to {} ({} bytes)", job_id,
                           step, path, *written);
    v1::ExportModelResponse resp;
    resp.set_path(path);
    resp.set_bytes(*written);
    resp.set_step(step);
    return resp;
  });
}

TaskSnapshot Trainer::Snapshot() const {
  absl::MutexLock l(&mu_);
  return snapshot_;
}

TrainerResult Trainer::result() const {
  absl::MutexLock l(&mu_);
  return result_;
}

absl::Status Trainer::Run() {
  State st;
  absl::Status s = RunImpl(&st);
  if (s.code() == absl::StatusCode::kAborted) {
    // A server fenced this task off: the scheduler gave its rank to a newer task (this worker
    // was paused or cut off meanwhile). It stops like a task told to stop, without reporting.
    Logger("worker")->warn("job {} rank {}: {}", task_.job_id(), task_.rank(), s.message());
    Cancel(s.message());
    s = absl::CancelledError(s.message());
  }
  absl::MutexLock l(&mu_);
  client_ = nullptr;
  if (!s.ok() && cancelled_.load()) {
    return absl::CancelledError(cancel_reason_.empty() ? "cancelled" : cancel_reason_);
  }
  return s;
}

absl::Status Trainer::RunImpl(State* st) {
  auto log = Logger("worker");
  const v1::JobSpec& spec = task_.spec();
  const uint32_t rank = task_.rank();
  const uint32_t num_workers = task_.num_workers();
  const std::string log_prefix = absl::StrCat("job ", task_.job_id(), " rank ", rank);

  // Data, backend, model.
  const bool streamed = data::IsStreamed(spec.dataset());
  if (streamed) {
    auto opened = OpenStreamedData(spec);
    if (!opened.ok()) return opened.status();
    st->streamed = std::move(*opened);
    log->info("{}: {}", log_prefix, st->streamed->Describe());
  } else {
    auto data = LoadTaskData(spec, options_.data_dirs);
    if (!data.ok()) return data.status();
    st->data = std::move(*data);
    log->info("{}: {}", log_prefix, st->data->description);
  }

  kernels::BackendOptions bopts;
  bopts.cpu_threads = options_.cpu_threads;
  bopts.cuda_allow_tf32 = spec.allow_tf32();
  bopts.cuda_graphs = spec.cuda_graphs();
  if (spec.cuda_graphs() && JobAsksForCpu(spec)) {
    // The job itself chose the CPU, where there is nothing to launch: refuse rather than ignore.
    // (A worker that falls back to the CPU for a job that left the device open ignores it.)
    return absl::InvalidArgumentError(
        "spec.cuda_graphs: applies to CUDA workers; this job asks for the CPU (device: cpu, or "
        "gpus_per_worker: 0)");
  }
  std::string device = EffectiveDevice(spec, options_.device);
  auto backend = kernels::CreateBackend(device, bopts);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("device '", device, "': ", backend.status().message()));
  }
  st->backend = std::move(*backend);
  if (spec.allow_tf32() && st->backend->name().rfind("cuda", 0) != 0) {
    // A CPU backend computes in float32 whatever the option says: refuse rather than ignore it.
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.allow_tf32: applies to CUDA; this task's backend is ", st->backend->name()));
  }
  v1::ModelSpec model_spec =
      streamed ? CompleteStreamedModelSpec(spec.model(), st->streamed->dataset->schema())
               : CompleteModelSpec(spec.model(), *st->data, spec.dataset());
  kernels::ModelOptions mopts;
  mopts.seed = spec.seed();
  auto model = kernels::CreateModel(model_spec, st->backend.get(), mopts);
  if (!model.ok()) {
    return absl::Status(model.status().code(), absl::StrCat("spec.", model.status().message()));
  }
  st->model = std::move(*model);
  // Partition and schedule.
  const data::PartitionSpec part = PartitionSpecOf(task_.partition(), rank, num_workers);
  const Schedule schedule =
      ScheduleFor(streamed ? st->streamed->train_lines : st->data->train_size(), part.count,
                  spec.batch_size(), spec.epochs());
  if (streamed) {
    auto train = StreamedTrainSource::Create(st->streamed.get(), part, spec.batch_size(),
                                             schedule.steps_per_epoch);
    if (!train.ok()) return train.status();
    st->train = std::move(*train);
    if (st->streamed->dataset->has_test()) {
      st->test = std::make_unique<StreamedTestSource>(st->streamed.get());
    }
  } else {
    auto train = InMemoryTrainSource::Create(st->data.get(), spec.seed(), part,
                                             spec.batch_size(), schedule.steps_per_epoch);
    if (!train.ok()) return train.status();
    st->train = std::move(*train);
    st->test = std::make_unique<InMemoryTestSource>(st->data.get());
  }
  // The keys an export writes of each sparse table: those the training set uses (a built-in
  // set), or the whole key space of the user's data (bounded at submission).
  std::vector<uint64_t> export_keys;
  if (!spec.export_path().empty() && model_spec.kind() == "sparse_linear") {
    if (streamed) {
      const uint64_t space = st->streamed->dataset->schema().key_space;
      if (space == 0 || space > kMaxExportKeys) {
        return absl::InvalidArgumentError(absl::StrCat(
            "export_path: exporting needs a key space of at most ", kMaxExportKeys,
            " keys; the data's is ", space == 0 ? "unbounded (set dataset.num_features)"
                                                : absl::StrCat(space)));
      }
      export_keys.resize(space);
      for (uint64_t k = 0; k < space; ++k) export_keys[k] = k;
    } else {
      export_keys = st->data->sparse_train.keys;
      std::sort(export_keys.begin(), export_keys.end());
      export_keys.erase(std::unique(export_keys.begin(), export_keys.end()), export_keys.end());
    }
  }
  auto tables = TableSpecsFor(*st->model, spec, schedule.total_steps);
  if (!tables.ok()) return tables.status();
  st->tables = std::move(*tables);
  log->info("{}: {} model on {}, {} tables", log_prefix, model_spec.kind(), st->backend->name(),
            st->tables.size());

  // The lead rank (0 unless rank 0 left the job) evaluates and exports; a task may become the
  // lead on the way (UpdatePartition). The export directory is created (and checked writable)
  // when the task starts as the lead, not after hours of training, and again before the export.
  auto lead = [&] { return lead_rank_.load() == rank; };
  if (lead() && !spec.export_path().empty()) {
    absl::Status ds =
        ExportDirReady(spec.export_path(), options_.export_root, "export_path", options_.export_fs);
    if (!ds.ok()) return ds;
  }

  // Parameter servers.
  PsClientOptions copts;
  copts.job_id = task_.job_id();
  copts.worker = rank;
  copts.attempt = task_.attempt();
  copts.data_secret = task_.data_secret();
  copts.channel = options_.channel;
  copts.call_timeout = options_.call_timeout;
  copts.data_transport = options_.data_transport;
  copts.spin = options_.data_spin;
  copts.shm_ring_bytes = options_.data_shm_ring_bytes;
  copts.latency = options_.call_latency.get();
  ProgressSink* sink = sink_;
  copts.refresh_shard_map = [sink]() { return sink->RefreshShardMap(); };
  auto client = options_.param_client_factory(copts, task_.shard_map(), st->tables);
  if (!client.ok()) return client.status();
  st->client = std::move(*client);
  {
    auto ctx = std::make_shared<ExportContext>();
    ctx->factory = options_.param_client_factory;
    ctx->fs = options_.export_fs;
    ctx->client = copts;
    ctx->client.data_transport = DataTransport::kGrpc;  // One pull; no data connections.
    ctx->client.latency = nullptr;
    ctx->client.refresh_shard_map = nullptr;  // A stale map fails the export; it is retried.
    ctx->tables = st->tables;
    ctx->params = st->model->params();
    ctx->sparse_keys = export_keys;
    ctx->list_keys = model_spec.kind() == "graph";
    ctx->model_kind = model_spec.kind();
    absl::MutexLock l(&mu_);
    client_ = st->client.get();
    snapshot_.shard_map_epoch = task_.shard_map().epoch();
    export_ctx_ = std::move(ctx);
  }
  if (options_.install_shard_map) {
    absl::Status s = st->client->InstallShardMap();
    if (!s.ok()) return s;
  }
  absl::Status s = st->client->CreateTables(spec.consistency(), num_workers,
                                            spec.checkpoint_every_steps(), spec.checkpoint_dir());
  if (!s.ok()) return s;

  // Progress: reports go to the sink; a sink that says stop cancels the task.
  StoppingSink stopping(this);
  ProgressReporter reporter(rank, schedule.total_steps, schedule.steps_per_epoch,
                            options_.report_interval, &stopping, [this](const TaskSnapshot& t) {
                              absl::MutexLock l(&mu_);
                              snapshot_.step = t.step;
                              snapshot_.samples_per_sec = t.samples_per_sec;
                              snapshot_.pull_wait_sec = t.pull_wait_sec;
                              snapshot_.compute_sec = t.compute_sec;
                              snapshot_.push_sec = t.push_sec;
                              snapshot_.data_bytes_read = t.data_bytes_read;
                              snapshot_.data_lines_skipped = t.data_lines_skipped;
                            });
  reporter.SetPart(st->train->examples(), st->train->batch());
  reporter.SetDataSource(st->train.get());

  const bool aggregate = spec.consistency().mode() == v1::ConsistencySpec::BSP &&
                         spec.consistency().aggregate();
  // Aggregate steps apply the mean over the step's examples: each rank weighs its gradient (a
  // mean over its batch) by its batch's share of the job's examples per step. Equal batches:
  // 1 / num_workers; a rank that reads the part of a rank that left has twice the batch.
  const double step_examples = static_cast<double>(spec.batch_size()) * num_workers;
  const int64_t eval_batch =
      spec.eval_batch_size() > 0 ? spec.eval_batch_size() : kDefaultEvalBatch;
  ParamSlot eval_slot;

  StepPipelineHooks hooks;
  hooks.cancelled = [this] { return cancelled_.load(); };
  hooks.take_partition = [&]() -> std::optional<data::PartitionSpec> {
    std::optional<v1::DataPartition> changed;
    {
      absl::MutexLock l(&mu_);
      changed.swap(new_partition_);
    }
    if (!changed.has_value()) return std::nullopt;
    return PartitionSpecOf(*changed, rank, num_workers);
  };
  hooks.computed = [this](int64_t n) {
    absl::MutexLock l(&mu_);
    snapshot_.step = n + 1;  // Computed; its push is under way.
  };
  hooks.grad_scale = [&](int64_t examples) -> float {
    if (!aggregate) return 1.0f;
    return static_cast<float>(examples / step_examples);
  };
  hooks.epoch_done = [&](int64_t epoch, int64_t step) -> absl::Status {
    const bool last_epoch = epoch + 1 == spec.epochs();
    // A streamed data set without a test split (no test, no holdout_fraction) is not evaluated.
    if (lead() && st->test != nullptr && (options_.eval_every_epoch || last_epoch)) {
      auto ev = Evaluate(*st->model, st->backend.get(), st->client.get(), st->test.get(), step,
                         eval_batch,
                         &eval_slot);
      if (!ev.ok()) return ev.status();
      reporter.SetEvaluation(ev->accuracy, ev->loss, ev->auc);
      log->info("job {} epoch {}/{}: test accuracy {:.4f}, loss {:.4f}, AUC {:.4f}",
                task_.job_id(), epoch + 1, spec.epochs(), ev->accuracy, ev->loss, ev->auc);
    }
    if (!reporter.Report(step, true)) return absl::CancelledError("cancelled");
    return absl::OkStatus();
  };
  const v1::ConsistencySpec& cons = spec.consistency();
  // A read one step early misses only this worker's own latest push: allowed when the servers
  // may serve reads that stale anyway (SSP with s >= 1, ASP).
  const bool prefetch = cons.mode() == v1::ConsistencySpec::ASP ||
                        (cons.mode() == v1::ConsistencySpec::SSP && cons.staleness() >= 1);
  StepPipeline pipeline(st->model.get(), st->backend.get(), st->client.get(), st->train.get(),
                        &reporter, schedule, prefetch, log_prefix, std::move(hooks));
  absl::Status trained = pipeline.Run(task_.start_step());
  if (!trained.ok()) return trained;

  // Export (the lead rank): the model as the servers hold it once every worker has pushed every
  // step; the sparse tables at every feature key the training set uses (a built-in set), the
  // data's whole key space (sparse_linear on the user's data) or the keys the servers hold rows
  // for (graph).
  std::string export_path;
  if (lead() && !spec.export_path().empty()) {
    absl::Status ds =
        ExportDirReady(spec.export_path(), options_.export_root, "export_path", options_.export_fs);
    if (!ds.ok()) return ds;
    std::map<std::string, std::string> meta = {{"job_id", task_.job_id()},
                                               {"model", model_spec.kind()},
                                               {"steps", absl::StrCat(schedule.total_steps)},
                                               {"producer", "pscluster"}};
    ParamSlot slot;
    // A graph model's sparse tables are keyed by the user's data: at the keys the servers hold.
    auto written =
        model_spec.kind() == "graph"
            ? ExportListed(st->model->params(), st->client.get(), schedule.total_steps,
                           spec.export_path(), meta, options_.export_fs)
            : ExportModel(*st->model, st->backend.get(), st->client.get(), schedule.total_steps,
                          export_keys, spec.export_path(), meta, &slot, options_.export_fs);
    if (!written.ok()) return written.status();
    export_path = spec.export_path();
    reporter.SetExportPath(export_path);
    log->info("job {}: model exported to {} ({} bytes)", task_.job_id(), export_path, *written);
  }
  reporter.Report(schedule.total_steps, true);

  const v1::WorkerProgress& progress = reporter.progress();
  absl::MutexLock l(&mu_);
  result_.steps = schedule.total_steps - task_.start_step();
  result_.test_accuracy = progress.test_accuracy();
  result_.test_loss = progress.test_loss();
  result_.test_auc = progress.test_auc();
  result_.train_loss = progress.loss();
  result_.train_sec = Seconds(pipeline.train_time());
  result_.train_start = pipeline.train_start();
  result_.train_end = pipeline.train_end();
  result_.samples_per_sec =
      reporter.examples_trained() / std::max(1e-9, Seconds(pipeline.train_time()));
  result_.pull_wait_sec = Seconds(reporter.total_pull());
  result_.compute_sec = Seconds(reporter.total_compute());
  result_.push_wait_sec = Seconds(reporter.total_push());
  const ParamClient::Stats cs = st->client->stats();
  result_.client_plan_sec = cs.plan_sec;
  result_.client_send_sec = cs.send_sec;
  result_.client_wait_sec = cs.wait_sec;
  result_.client_copy_sec = cs.copy_sec;
  result_.export_path = export_path;
  result_.device = st->backend->name();
  return absl::OkStatus();
}

}  // namespace pscluster::worker
