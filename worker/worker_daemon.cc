#include "worker/worker_daemon.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/atomic_file.h"
#include "common/host_memory.h"
#include "common/logging.h"
#include "common/path_root.h"
#include "kernels/device_probe.h"
#include "server/tls_stream.h"

namespace pscluster::worker {

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Start(WorkerDaemonOptions options) {
  auto log = Logger("worker");
  std::unique_ptr<WorkerDaemon> d(new WorkerDaemon());
  TrainerOptions& topts = options.trainer;
  if (!topts.export_root.empty()) {
    auto root = ResolveRoot(topts.export_root, "--export_root");
    if (!root.ok()) return root.status();
    topts.export_root = *root;
  }

  auto authz = Authorizer::Create(options.token_file);
  if (!authz.ok()) return authz.status();
  d->authz_ = std::move(*authz);
  LogAuthMode("worker", *d->authz_, topts.channel.tls.enabled() && !topts.channel.tls.ca.empty());

  auto scheduler =
      SchedulerClient::Create(options.scheduler_address, topts.channel, absl::Seconds(5));
  if (!scheduler.ok()) return scheduler.status();
  d->scheduler_ = std::move(*scheduler);

  CudaAvailability cuda = ProbeCuda();
  const bool cpu_only = topts.device == "cpu";
  WorkerNodeOptions nopts;
  nopts.capacity.set_cpu_slots(std::max(0, options.cpu_slots));
  nopts.capacity.set_gpus(cpu_only ? 0 : static_cast<uint32_t>(cuda.device_count));
  nopts.capacity.set_memory_bytes(options.memory_bytes > 0 ? options.memory_bytes
                                                           : HostMemoryBytes());
  nopts.device = cuda.usable() && !cpu_only
                     ? absl::StrCat("cuda (", cuda.device_count, " x ", cuda.device_name, ")")
                     : std::string("cpu");
  nopts.registration_timeout = options.registration_timeout;
  if (!cuda.usable()) log->info("CUDA: {}", cuda.reason);
  d->device_ = nopts.device;

  // Call latencies observed by every task; the node's status sampled at scrape time (below).
  {
    const std::string help =
        "Duration of the worker's data-plane calls to the servers (pull, push, push_pull: one "
        "round of a step, waiting for slower workers under BSP/SSP included).";
    auto latency = std::make_shared<CallLatency>();
    const std::string name = "pscluster_worker_call_seconds";
    latency->pull = d->metrics_.AddHistogram(name, help, "call=\"pull\"");
    latency->push = d->metrics_.AddHistogram(name, help, "call=\"push\"");
    latency->push_pull = d->metrics_.AddHistogram(name, help, "call=\"push_pull\"");
    topts.call_latency = std::move(latency);
  }
  EntrypointOptions eopts = options.entrypoint;
  eopts.scheduler = options.scheduler_address;
  eopts.logs = &d->task_logs_;
  nopts.allow_entrypoints = eopts.allow;
  if (eopts.allow) log->warn("--allow_entrypoints: jobs may run their own commands as this user");
  auto factory = [topts, eopts](const v1::AssignTaskRequest& task, ProgressSink* sink)
      -> absl::StatusOr<std::unique_ptr<TaskRunner>> {
    if (task.spec().has_entrypoint()) {
      auto e = EntrypointRunner::Create(task, eopts, sink);
      if (!e.ok()) return e.status();
      return std::unique_ptr<TaskRunner>(std::move(*e));
    }
    auto t = Trainer::Create(task, topts, sink);
    if (!t.ok()) return t.status();
    return std::unique_ptr<TaskRunner>(std::move(*t));
  };
  d->node_ = std::make_unique<WorkerNode>(nopts, d->scheduler_.get(), factory);
  d->service_ =
      std::make_unique<WorkerService>(d->node_.get(), d->authz_.get(), &d->task_logs_);
  d->service_->ObserveLatency(&d->metrics_, "pscluster_worker_rpc_seconds");
  d->service_->ObserveAudit(&d->metrics_, "pscluster_worker_audit_calls_total");
  d->service_->SetSchedulerTermFence(&d->fence_);
  if (!options.audit_log.empty()) {
    auto audit = AuditLog::Open(options.audit_log);
    if (!audit.ok()) return audit.status();
    d->audit_ = std::move(*audit);
    d->service_->SetAuditLog(d->audit_.get());
  }
  GrpcServerOptions gopts;
  gopts.listen_address = options.listen_address;
  gopts.tls = topts.channel.tls;
  gopts.component = "worker";
  auto server = GrpcServer::Start(gopts, {d->service_.get()});
  if (!server.ok()) return server.status();
  d->server_ = std::move(*server);
  d->address_ = options.advertise_host.empty()
                    ? d->server_->address()
                    : absl::StrCat(options.advertise_host, ":", d->server_->port());
  d->node_->SetAddress(d->address_);
  if (auto w = LoopbackAdvertiseWarning(d->address_, options.scheduler_address)) {
    log->warn("{}", *w);
  }

  d->AddStatusGauges();
  if (!options.metrics_address.empty()) {
    auto ms = MetricsHttpServer::Start(options.metrics_address, &d->metrics_);
    if (!ms.ok()) return ms.status();
    d->metrics_server_ = std::move(*ms);
    log->info("Prometheus metrics on port {} (/metrics)", d->metrics_server_->port());
  }

  d->node_->Start(std::move(options.on_fatal));
  if (!options.port_file.empty()) {
    absl::Status s = WriteFileAtomically(options.port_file, d->address_ + "\n");
    if (!s.ok()) return s;
  }
  log->info("ps_worker serving on {} (scheduler {}, device {}{})", d->address_,
            options.scheduler_address, d->device_,
            !topts.channel.tls.enabled() ? ""
            : TlsIo::UsesVectorAes()
                ? "; TLS data records in AES-GCM on the CPU's VAES/VPCLMULQDQ"
                : "; TLS data records by OpenSSL (--tls_vector_aes=false or no VAES/VPCLMULQDQ "
                  "on this CPU)");
  return d;
}

void WorkerDaemon::AddStatusGauges() {
  WorkerNode* n = node_.get();
  auto gauge = [this, n](const std::string& name, const std::string& help,
                         std::function<double(const v1::WorkerStatus&)> fn) {
    metrics_.AddGaugeCallback(name, help, [n, fn] {
      v1::WorkerStatus st = n->Status();
      return std::vector<Sample>{{"", fn(st)}};
    });
  };
  SchedulerTermFence* fence = &fence_;
  metrics_.AddGaugeCallback(
      "pscluster_worker_scheduler_term",
      "Highest scheduler term (etcd revision of the leader's election) seen; 0 with one "
      "scheduler.",
      [fence] { return std::vector<Sample>{{"", double(fence->term())}}; });
  metrics_.AddCounterCallback(
      "pscluster_worker_deposed_scheduler_calls_total",
      "Calls refused because they came from a deposed scheduler (a lower term).",
      [fence] { return std::vector<Sample>{{"", double(fence->refused())}}; });
  gauge("pscluster_worker_busy", "1 while a training task runs.",
        [](const v1::WorkerStatus& s) { return s.busy() ? 1.0 : 0.0; });
  gauge("pscluster_worker_step", "Steps completed by the current task.",
        [](const v1::WorkerStatus& s) { return static_cast<double>(s.step()); });
  gauge("pscluster_worker_samples_per_second", "Training throughput, last window.",
        [](const v1::WorkerStatus& s) { return s.samples_per_sec(); });
  gauge("pscluster_worker_pull_wait_seconds", "Time waiting on pulls, current task.",
        [](const v1::WorkerStatus& s) { return s.pull_wait_sec(); });
  gauge("pscluster_worker_compute_seconds", "Time computing, current task.",
        [](const v1::WorkerStatus& s) { return s.compute_sec(); });
  gauge("pscluster_worker_push_wait_seconds", "Time blocked on pushes, current task.",
        [](const v1::WorkerStatus& s) { return s.push_sec(); });
  gauge("pscluster_worker_data_bytes_read", "Bytes of the user's files read, current task.",
        [](const v1::WorkerStatus& s) { return static_cast<double>(s.data_bytes_read()); });
  gauge("pscluster_worker_data_lines_skipped",
        "Malformed lines skipped (dataset.on_error: skip), current task.",
        [](const v1::WorkerStatus& s) { return static_cast<double>(s.data_lines_skipped()); });
}

void WorkerDaemon::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_) server_->Shutdown(absl::Seconds(2));
  if (node_) node_->Shutdown();
  metrics_server_.reset();
}

WorkerDaemon::~WorkerDaemon() { Shutdown(); }

}  // namespace pscluster::worker
