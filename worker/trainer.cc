#include "worker/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <future>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/step_io.h"
#include "server/client/ps_client.h"
#include "server/executor.h"
#include "worker/data/partition.h"
#include "worker/tables.h"

namespace pscluster::worker {
namespace {

constexpr int kDefaultEvalBatch = 1000;

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// Which backend the task uses: the job's explicit choice, else CPU for jobs that ask for no GPU,
// else the worker's own --device.
std::string EffectiveDevice(const v1::JobSpec& spec, const std::string& worker_device) {
  if (!spec.device().empty() && spec.device() != "auto") return spec.device();
  if (spec.gpus_per_worker() == 0) return "cpu";
  return worker_device;
}

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
};

}  // namespace

// Everything Run() builds, owned by the task thread.
struct Trainer::State {
  std::unique_ptr<TaskData> data;
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<kernels::Model> model;
  std::vector<v1::TableSpec> tables;
  std::unique_ptr<PsClient> client;
  std::unique_ptr<Batcher> test_batcher;
  std::vector<int64_t> partition;

  // Per-step buffers: step n computes with slot n % 3 while the pull of step n + 1 and the push of
  // step n - 1 use the other two. Values and gradients live in the backend's host memory
  // (page-locked on CUDA), so the model copies them to and from the device without staging.
  struct Slot {
    std::vector<std::vector<uint64_t>> keys;   // Per parameter (sparse only).
    std::vector<kernels::HostArray> values;    // Per parameter.
    std::vector<kernels::HostArray> grads;     // Per parameter.
  };
  Slot slots[3];

  // Sizes the slot's buffers for `keys` (keeping what they hold) and builds the pull targets /
  // push sources over it.
  absl::Status Prepare(Slot* slot, std::vector<std::vector<uint64_t>> keys) {
    const auto& params = model->params();
    slot->keys = std::move(keys);
    slot->values.resize(params.size());
    slot->grads.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      size_t n = params[i].sparse ? slot->keys[i].size() * params[i].row_width
                                  : static_cast<size_t>(params[i].num_elements());
      absl::Status s = slot->values[i].Resize(backend.get(), n);
      if (s.ok()) s = slot->grads[i].Resize(backend.get(), n);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  PullTargets Targets(Slot* slot, bool dense, bool sparse) {
    PullTargets t;
    const auto& params = model->params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].sparse && sparse) {
        t.sparse.push_back({params[i].name, slot->keys[i], slot->values[i].data()});
      } else if (!params[i].sparse && dense) {
        t.dense.push_back({params[i].name, slot->values[i].data()});
      }
    }
    return t;
  }

  PushSources Sources(const Slot& slot) {
    PushSources s;
    const auto& params = model->params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].sparse) {
        s.sparse.push_back({params[i].name, slot.keys[i], slot.grads[i].data()});
      } else {
        s.dense.push_back({params[i].name, slot.grads[i].data()});
      }
    }
    return s;
  }

  static kernels::ParamValues Values(const Slot& slot) {
    kernels::ParamValues pv;
    for (size_t i = 0; i < slot.values.size(); ++i) {
      pv.values.push_back(slot.values[i]);
      pv.keys.push_back(slot.keys[i]);
    }
    return pv;
  }

  static kernels::Gradients Grads(Slot* slot) {
    kernels::Gradients g;
    for (auto& v : slot->grads) g.values.push_back(absl::MakeSpan(v));
    return g;
  }
};

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const v1::AssignTaskRequest& task,
                                                         const TrainerOptions& options,
                                                         ProgressSink* sink) {
  const v1::JobSpec& spec = task.spec();
  if (spec.batch_size() == 0 || spec.batch_size() > (1u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.batch_size: ", spec.batch_size(), " is not in [1, 1048576]"));
  }
  if (spec.epochs() == 0) return absl::InvalidArgumentError("spec.epochs: must be >= 1");
  if (spec.model().kind().empty()) return absl::InvalidArgumentError("spec.model.kind: missing");
  if (spec.dataset().name().empty()) {
    return absl::InvalidArgumentError("spec.dataset.name: missing");
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

namespace {

data::PartitionSpec PartitionSpecOf(const v1::DataPartition& p, uint32_t rank,
                                    uint32_t num_workers) {
  data::PartitionSpec part;
  part.index = p.count() > 0 ? p.index() : rank;
  part.count = p.count() > 0 ? p.count() : num_workers;
  part.begin = p.begin();
  part.end = p.end();
  part.also.assign(p.also().begin(), p.also().end());
  part.shares.assign(p.shares().begin(), p.shares().end());
  return part;
}

}  // namespace

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

  // Data, backend, model.
  auto data = LoadTaskData(spec, options_.data_dirs);
  if (!data.ok()) return data.status();
  st->data = std::move(*data);
  log->info("job {} rank {}: {}", task_.job_id(), rank, st->data->description);

  kernels::BackendOptions bopts;
  bopts.cpu_threads = options_.cpu_threads;
  std::string device = EffectiveDevice(spec, options_.device);
  auto backend = kernels::CreateBackend(device, bopts);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("device '", device, "': ", backend.status().message()));
  }
  st->backend = std::move(*backend);
  v1::ModelSpec model_spec = CompleteModelSpec(spec.model(), *st->data, spec.dataset());
  kernels::ModelOptions mopts;
  mopts.seed = spec.seed();
  auto model = kernels::CreateModel(model_spec, st->backend.get(), mopts);
  if (!model.ok()) {
    return absl::Status(model.status().code(), absl::StrCat("spec.", model.status().message()));
  }
  st->model = std::move(*model);
  // Partition and schedule.
  const data::PartitionSpec part = PartitionSpecOf(task_.partition(), rank, num_workers);
  auto partition = data::PartitionExamples(st->data->train_size(), spec.seed(), part);
  if (!partition.ok()) return partition.status();
  st->partition = std::move(*partition);
  // The job's schedule: steps per epoch as for equal parts of the job's batch. This rank's batch
  // is its parts' share of the job's examples per step (the job's batch for one equal part).
  const int64_t smallest_part = st->data->train_size() / part.count;
  const int64_t steps_per_epoch = std::max<int64_t>(1, smallest_part / spec.batch_size());
  // Never more than its partition in one step (shares sent by a caller other than the scheduler
  // could ask for any size), nor less than the job's batch when that is larger.
  auto rank_batch = [&](const data::PartitionSpec& p, size_t examples) -> int64_t {
    return std::min<int64_t>(data::RankBatch(p, spec.batch_size()),
                             std::max<int64_t>(spec.batch_size(), examples));
  };
  int64_t batch = rank_batch(part, st->partition.size());
  const int64_t total_steps = steps_per_epoch * spec.epochs();
  auto tables = TableSpecsFor(*st->model, spec, total_steps);
  if (!tables.ok()) return tables.status();
  st->tables = std::move(*tables);
  log->info("job {} rank {}: {} model on {}, {} tables", task_.job_id(), rank, model_spec.kind(),
            st->backend->name(), st->tables.size());

  // The lead rank (0 unless rank 0 left the job) evaluates and exports; a task may become the
  // lead on the way (UpdatePartition). The export directory is created (and checked writable)
  // when the task starts as the lead, not after hours of training, and again before the export.
  auto lead = [&] { return lead_rank_.load() == rank; };
  auto export_dir_ready = [&]() -> absl::Status {
    const std::string& path = spec.export_path();
    size_t slash = path.rfind('/');
    std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    absl::Status ds = MakeDirs(dir);
    if (ds.ok()) {
      std::string probe = absl::StrCat(path, ".probe");
      ds = WriteFileAtomically(probe, "");
      ::unlink(probe.c_str());
    }
    if (!ds.ok()) return absl::Status(ds.code(), absl::StrCat("export_path: ", ds.message()));
    return absl::OkStatus();
  };
  if (lead() && !spec.export_path().empty()) {
    absl::Status ds = export_dir_ready();
    if (!ds.ok()) return ds;
  }

  // Parameter servers.
  PsClientOptions copts;
  copts.job_id = task_.job_id();
  copts.worker = rank;
  copts.attempt = task_.attempt();
  copts.channel = options_.channel;
  copts.call_timeout = options_.call_timeout;
  copts.data_transport = options_.data_transport;
  copts.spin = options_.data_spin;
  copts.shm_ring_bytes = options_.data_shm_ring_bytes;
  ProgressSink* sink = sink_;
  copts.refresh_shard_map = [sink]() { return sink->RefreshShardMap(); };
  auto client = PsClient::Create(copts, task_.shard_map(), st->tables);
  if (!client.ok()) return client.status();
  st->client = std::move(*client);
  {
    absl::MutexLock l(&mu_);
    client_ = st->client.get();
    snapshot_.shard_map_epoch = task_.shard_map().epoch();
  }
  if (options_.install_shard_map) {
    absl::Status s = st->client->InstallShardMap();
    if (!s.ok()) return s;
  }
  absl::Status s = st->client->CreateTables(spec.consistency(), num_workers,
                                            spec.checkpoint_every_steps(), spec.checkpoint_dir());
  if (!s.ok()) return s;

  st->test_batcher = st->data->TestBatcher();
  const bool aggregate = spec.consistency().mode() == v1::ConsistencySpec::BSP &&
                         spec.consistency().aggregate();
  // Aggregate steps apply the mean over the step's examples: each rank weighs its gradient (a
  // mean over its batch) by its batch's share of the job's examples per step. Equal batches:
  // 1 / num_workers; a rank that reads the part of a rank that left has twice the batch.
  const double step_examples = static_cast<double>(spec.batch_size()) * num_workers;
  auto grad_scale = [&](int64_t examples) -> float {
    if (!aggregate) return 1.0f;
    return static_cast<float>(examples / step_examples);
  };

  // Test-set evaluation of the model as the servers hold it at `clock`.
  State::Slot eval_slot;
  auto evaluate = [&](int64_t clock) -> absl::StatusOr<EvalResult> {
    const int64_t n = st->data->test_size();
    const int64_t eb = spec.eval_batch_size() > 0 ? spec.eval_batch_size() : kDefaultEvalBatch;
    std::vector<int64_t> ids;
    double loss = 0;
    int64_t correct = 0;
    bool dense_pulled = false;
    for (int64_t start = 0; start < n; start += eb) {
      ids.resize(std::min(eb, n - start));
      std::iota(ids.begin(), ids.end(), start);
      kernels::Batch b = st->test_batcher->Make(ids);
      auto keys = st->model->SparseKeys(b);
      if (!keys.ok()) return keys.status();
      // Dense values persist in eval_slot across batches (Prepare keeps them); only sparse
      // rows change.
      absl::Status prep = st->Prepare(&eval_slot, std::move(*keys));
      if (!prep.ok()) return prep;
      absl::Status ps = st->client->Pull(clock, st->Targets(&eval_slot, !dense_pulled, true));
      if (!ps.ok()) return ps;
      dense_pulled = true;
      kernels::StepResult r;
      absl::Status es = st->model->Evaluate(b, State::Values(eval_slot), &r);
      if (!es.ok()) return es;
      loss += r.loss * r.examples;
      correct += r.correct;
    }
    return EvalResult{loss / n, static_cast<double>(correct) / n};
  };

  // Progress window.
  v1::WorkerProgress progress;
  progress.set_rank(rank);
  progress.set_total_steps(total_steps);
  progress.set_examples(st->partition.size());
  progress.set_batch_size(static_cast<uint32_t>(batch));
  progress.set_test_accuracy(-1);
  progress.set_test_loss(-1);
  double win_loss = 0;
  int64_t win_correct = 0, win_examples = 0;
  absl::Duration win_pull, win_compute, win_push, tot_pull, tot_compute, tot_push;
  absl::Time win_start = absl::Now();
  absl::Duration train_time;  // In the step loop, evaluation excluded.
  absl::Time train_start, train_end;
  int64_t run_examples = 0;
  auto report = [&](int64_t done_steps, bool force) -> bool {
    absl::Time now = absl::Now();
    if (!force && now - win_start < options_.report_interval) return true;
    double secs = std::max(1e-9, Seconds(now - win_start));
    progress.set_step(done_steps);
    progress.set_epoch(static_cast<uint32_t>(done_steps / steps_per_epoch));
    if (win_examples > 0) {
      progress.set_loss(win_loss / win_examples);
      progress.set_train_accuracy(static_cast<double>(win_correct) / win_examples);
      progress.set_samples_per_sec(win_examples / secs);
    }
    progress.set_pull_wait_sec(Seconds(win_pull));
    progress.set_compute_sec(Seconds(win_compute));
    progress.set_push_sec(Seconds(win_push));
    progress.set_compute_rate(win_compute > absl::ZeroDuration()
                                  ? win_examples / Seconds(win_compute)
                                  : 0.0);
    {
      absl::MutexLock l(&mu_);
      snapshot_.step = done_steps;
      snapshot_.samples_per_sec = progress.samples_per_sec();
      snapshot_.pull_wait_sec = Seconds(tot_pull);
      snapshot_.compute_sec = Seconds(tot_compute);
      snapshot_.push_sec = Seconds(tot_push);
    }
    win_loss = 0;
    win_correct = win_examples = 0;
    win_pull = win_compute = win_push = absl::ZeroDuration();
    win_start = now;
    if (!sink_->Report(progress)) {
      Cancel("the scheduler stopped the job");
      return false;
    }
    return true;
  };

  // The training loop. Step n computes with slot n % 3: the pull of step n + 1 (prefetched where
  // the consistency model allows) fills slot (n + 1) % 3 and the push of step n - 1 reads slot
  // (n - 1) % 3 meanwhile. Batches alternate between two batchers for the same reason.
  const v1::ConsistencySpec& cons = spec.consistency();
  // A read one step early misses only this worker's own latest push: allowed when the servers
  // may serve reads that stale anyway (SSP with s >= 1, ASP).
  const bool prefetch = cons.mode() == v1::ConsistencySpec::ASP ||
                        (cons.mode() == v1::ConsistencySpec::SSP && cons.staleness() >= 1);
  std::unique_ptr<Batcher> batchers[2] = {st->data->TrainBatcher(), st->data->TrainBatcher()};
  kernels::Batch batches[2];
  std::vector<int64_t> orders[2];  // Epoch orders, by epoch parity.
  int64_t order_epoch[2] = {-1, -1};
  std::vector<int64_t> ids(batch);
  auto prepare = [&](int64_t n) -> absl::Status {
    int64_t epoch = n / steps_per_epoch, j = n % steps_per_epoch;
    std::optional<v1::DataPartition> changed;
    {
      absl::MutexLock l(&mu_);
      changed.swap(new_partition_);
    }
    if (changed.has_value()) {
      // A rank left the job and its part comes here: this epoch's order is drawn again from
      // the whole new partition (the positions already trained stay counted).
      const data::PartitionSpec next = PartitionSpecOf(*changed, rank, num_workers);
      auto more = data::PartitionExamples(st->data->train_size(), spec.seed(), next);
      if (more.ok()) {
        batch = rank_batch(next, more->size());
        log->info("job {} rank {}: now reads {} examples (part {} and {} more of {}{}), {} per "
                  "step",
                  task_.job_id(), rank, more->size(), part.index, changed->also_size(),
                  part.count, next.shares.empty() ? "" : ", sized by speed", batch);
        st->partition = std::move(*more);
        progress.set_examples(st->partition.size());
        progress.set_batch_size(static_cast<uint32_t>(batch));
        order_epoch[0] = order_epoch[1] = -1;
      } else {
        log->warn("job {} rank {}: partition update not applied: {}", task_.job_id(), rank,
                  more.status().message());
      }
    }
    std::vector<int64_t>& order = orders[epoch & 1];
    if (order_epoch[epoch & 1] != epoch) {
      order = data::EpochOrder(st->partition, spec.seed(), static_cast<uint32_t>(epoch), part.index);
      order_epoch[epoch & 1] = epoch;
    }
    ids.resize(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) {
      ids[i] = order[static_cast<size_t>((j * batch + i) % static_cast<int64_t>(order.size()))];
    }
    batches[n & 1] = batchers[n & 1]->Make(ids);
    auto keys = st->model->SparseKeys(batches[n & 1]);
    if (!keys.ok()) return keys.status();
    return st->Prepare(&st->slots[n % 3], std::move(*keys));
  };
  PsClient* psc = st->client.get();
  // Prefetched pulls and background pushes run on two long-lived threads (one call in flight on
  // each), not on a new thread per call. Declared before the futures, so that the futures are
  // destroyed first and each thread finishes what it runs before it is joined.
  std::unique_ptr<Executor> pull_thread, push_thread;
  if (prefetch) {
    pull_thread = std::make_unique<Executor>(1, "prefetch");
    push_thread = std::make_unique<Executor>(1, "push");
  }
  auto run_on = [](Executor* ex, std::function<absl::Status()> fn) {
    auto task = std::make_shared<std::packaged_task<absl::Status()>>(std::move(fn));
    std::future<absl::Status> f = task->get_future();
    ex->Post([task] { (*task)(); });
    return f;
  };
  std::future<absl::Status> pending_push, pending_pull;
  auto start_pull = [&](int64_t n) {
    PullTargets targets = st->Targets(&st->slots[n % 3], true, true);
    pending_pull = run_on(pull_thread.get(), [psc, n, targets = std::move(targets)] {
      return psc->Pull(n, targets);
    });
  };
  auto wait = [&](std::future<absl::Status>* f, absl::Duration* win,
                  absl::Duration* total) -> absl::Status {
    if (!f->valid()) return absl::OkStatus();
    absl::Time t0 = absl::Now();
    absl::Status ps = f->get();
    *win += absl::Now() - t0;
    *total += absl::Now() - t0;
    return ps;
  };
  auto drain = [&]() {
    if (pending_pull.valid()) pending_pull.wait();
    if (pending_push.valid()) pending_push.wait();
  };

  // Without prefetching (BSP, SSP with s = 0), the push of step n and the pull of step n + 1 go
  // out as one push-pull round per server: each block's new value comes back as soon as the
  // server has applied it (and the consistency model allows the read), with no second round trip.
  const bool fused = !prefetch;
  int64_t step = task_.start_step();
  if (step < total_steps) {
    absl::Status s0 = prepare(step);
    if (!s0.ok()) return s0;
    if (prefetch) {
      start_pull(step);
    } else {
      absl::Time t0 = absl::Now();
      absl::Status ps = psc->Pull(step, st->Targets(&st->slots[step % 3], true, true));
      tot_pull += absl::Now() - t0;
      win_pull += absl::Now() - t0;
      if (!ps.ok()) return ps;
    }
  }
  for (int64_t epoch = step / steps_per_epoch; epoch < spec.epochs(); ++epoch) {
    const absl::Time epoch_start = absl::Now();
    if (train_start == absl::Time()) train_start = epoch_start;
    for (int64_t j = step - epoch * steps_per_epoch; j < steps_per_epoch; ++j, ++step) {
      if (cancelled_.load()) {
        drain();
        return absl::CancelledError("cancelled");
      }
      State::Slot& slot = st->slots[step % 3];
      if (prefetch) {
        absl::Status ps = wait(&pending_pull, &win_pull, &tot_pull);
        if (!ps.ok()) {
          drain();
          return ps;
        }
      }
      if (step + 1 < total_steps) {
        absl::Status s1 = prepare(step + 1);
        if (!s1.ok()) {
          drain();
          return s1;
        }
        if (prefetch) start_pull(step + 1);
      }
      absl::Time t1 = absl::Now();
      kernels::StepResult r;
      kernels::Gradients grads = State::Grads(&slot);
      grads.scale = grad_scale(batches[step & 1].num_examples);  // Applied in the loss kernel.
      absl::Status cs = st->model->TrainStep(batches[step & 1], State::Values(slot), grads, &r);
      if (!cs.ok()) {
        drain();
        return cs;
      }
      absl::Time t2 = absl::Now();
      {
        absl::MutexLock l(&mu_);
        snapshot_.step = step + 1;  // Computed; its push is under way.
      }
      win_compute += t2 - t1;
      tot_compute += t2 - t1;
      win_loss += r.loss * r.examples;
      win_correct += r.correct;
      win_examples += r.examples;
      run_examples += r.examples;

      if (fused) {
        absl::Time t0 = absl::Now();
        absl::Status ps =
            step + 1 < total_steps
                ? psc->PushPull(step, st->Sources(slot),
                                st->Targets(&st->slots[(step + 1) % 3], true, true))
                : psc->Push(step, st->Sources(slot));
        win_pull += absl::Now() - t0;
        tot_pull += absl::Now() - t0;
        if (!ps.ok()) {
          drain();
          return ps;
        }
      } else {
        // Step n - 1's push must be done before step n's starts (one push in flight, in order).
        absl::Status prev = wait(&pending_push, &win_push, &tot_push);
        if (!prev.ok()) {
          drain();
          return prev;
        }
        PushSources sources = st->Sources(slot);
        pending_push = run_on(push_thread.get(), [psc, step, sources = std::move(sources)] {
          return psc->Push(step, sources);
        });
      }
      if (!report(step + 1, false)) {
        drain();
        return absl::CancelledError("cancelled");
      }
    }
    absl::Status prev = wait(&pending_push, &win_push, &tot_push);
    if (!prev.ok()) {
      drain();
      return prev;
    }
    train_end = absl::Now();
    train_time += train_end - epoch_start;
    const bool last_epoch = epoch + 1 == spec.epochs();
    if (lead() && (options_.eval_every_epoch || last_epoch)) {
      auto ev = evaluate(step);
      if (!ev.ok()) {
        drain();
        return ev.status();
      }
      progress.set_test_accuracy(ev->accuracy);
      progress.set_test_loss(ev->loss);
      log->info("job {} epoch {}/{}: test accuracy {:.4f}, loss {:.4f}", task_.job_id(), epoch + 1,
                spec.epochs(), ev->accuracy, ev->loss);
    }
    if (!report(step, true)) return absl::CancelledError("cancelled");
  }

  // Export (the lead rank): the model as the servers hold it once every worker has pushed every
  // step.
  std::string export_path;
  if (lead() && !spec.export_path().empty()) {
    absl::Status ds = export_dir_ready();
    if (!ds.ok()) return ds;
    State::Slot& slot = st->slots[0];
    std::vector<std::vector<uint64_t>> keys(st->model->params().size());
    for (size_t i = 0; i < st->model->params().size(); ++i) {
      if (!st->model->params()[i].sparse) continue;
      // Every feature key the training set uses.
      std::vector<uint64_t> all(st->data->sparse_train.keys);
      std::sort(all.begin(), all.end());
      all.erase(std::unique(all.begin(), all.end()), all.end());
      keys[i] = std::move(all);
    }
    absl::Status ps = st->Prepare(&slot, std::move(keys));
    if (ps.ok()) ps = st->client->Pull(total_steps, st->Targets(&slot, true, true));
    if (!ps.ok()) return ps;
    std::vector<SafetensorsTensor> tensors;
    for (size_t i = 0; i < st->model->params().size(); ++i) {
      const kernels::ParamInfo& p = st->model->params()[i];
      absl::string_view bytes(reinterpret_cast<const char*>(slot.values[i].data()),
                              slot.values[i].size() * sizeof(float));
      if (p.sparse) {
        tensors.push_back({p.name + ".keys", v1::DT_UINT64, {slot.keys[i].size()},
                           absl::string_view(reinterpret_cast<const char*>(slot.keys[i].data()),
                                             slot.keys[i].size() * sizeof(uint64_t))});
        tensors.push_back({p.name, v1::DT_FLOAT32,
                           {slot.keys[i].size(), static_cast<uint64_t>(p.row_width)}, bytes});
      } else {
        std::vector<uint64_t> shape(p.shape.begin(), p.shape.end());
        tensors.push_back({p.name, v1::DT_FLOAT32, shape, bytes});
      }
    }
    std::map<std::string, std::string> meta = {{"job_id", task_.job_id()},
                                               {"model", model_spec.kind()},
                                               {"steps", absl::StrCat(total_steps)},
                                               {"producer", "pscluster"}};
    auto written = WriteSafetensors(spec.export_path(), tensors, meta);
    if (!written.ok()) {
      return absl::Status(written.status().code(),
                          absl::StrCat("export_path: ", written.status().message()));
    }
    export_path = spec.export_path();
    progress.set_export_path(export_path);
    log->info("job {}: model exported to {} ({} bytes)", task_.job_id(), export_path, *written);
  }
  report(total_steps, true);

  absl::MutexLock l(&mu_);
  result_.steps = total_steps - task_.start_step();
  result_.test_accuracy = progress.test_accuracy();
  result_.test_loss = progress.test_loss();
  result_.train_loss = progress.loss();
  result_.train_sec = Seconds(train_time);
  result_.train_start = train_start;
  result_.train_end = train_end;
  result_.samples_per_sec = run_examples / std::max(1e-9, Seconds(train_time));
  result_.pull_wait_sec = Seconds(tot_pull);
  result_.compute_sec = Seconds(tot_compute);
  result_.push_wait_sec = Seconds(tot_push);
  const PsClient::Stats cs = psc->stats();
  result_.client_plan_sec = cs.plan_sec;
  result_.client_send_sec = cs.send_sec;
  result_.client_wait_sec = cs.wait_sec;
  result_.client_copy_sec = cs.copy_sec;
  result_.export_path = export_path;
  result_.device = st->backend->name();
  return absl::OkStatus();
}

}  // namespace pscluster::worker
