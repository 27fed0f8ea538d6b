#include "scheduler/scheduler_daemon.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pscluster::scheduler {

absl::StatusOr<std::unique_ptr<SchedulerDaemon>> SchedulerDaemon::Start(
    const SchedulerDaemonOptions& options, const Clock* clock, std::unique_ptr<Store> store) {
  if (!options.http_address.empty() && options.tls.enabled()) {
    const std::string host = options.http_address.substr(0, options.http_address.rfind(':'));
    if (host != "127.0.0.1" && host != "localhost") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--http_listen: '", options.http_address,
          "': the status page is plain HTTP and the scheduler uses TLS; bind it to 127.0.0.1 and "
          "reach it through an SSH tunnel, kubectl port-forward or a TLS-terminating proxy"));
    }
  }
  std::unique_ptr<SchedulerDaemon> d(new SchedulerDaemon());
  if (clock == nullptr) clock = &d->real_clock_;
  if (store == nullptr) {
    auto opened = Store::Open(StoreOptions{options.db_path, options.db_full_sync});
    if (!opened.ok()) return opened.status();
    store = std::move(*opened);
  }
  d->store_ = std::move(store);

  GrpcClusterRpcOptions rpc_options;
  rpc_options.channel.tls = options.tls;
  rpc_options.channel.bearer_token = options.credential;
  rpc_options.timeout = options.rpc_timeout;
  rpc_options.scheduler_term = options.scheduler_term;
  absl::StatusOr<std::string> cluster_key = d->store_->ClusterKey();
  if (!cluster_key.ok()) return cluster_key.status();
  rpc_options.cluster_key = *cluster_key;
  d->rpc_ = std::make_unique<GrpcClusterRpc>(rpc_options);

  SchedulerOptions scheduler_options = options.scheduler;
  if (!options.quota_file.empty()) {
    if (options.token_file.empty()) {
      return absl::InvalidArgumentError(
          "--quota_file: quotas are per identity and need --token_file (without it callers are "
          "not identified)");
    }
    auto quotas = Quotas::Load(options.quota_file);
    if (!quotas.ok()) return quotas.status();
    scheduler_options.quotas = std::make_shared<const Quotas>(std::move(*quotas));
    d->quota_file_ = options.quota_file;
  }
  auto sched = Scheduler::Create(scheduler_options, d->store_.get(), clock, d->rpc_.get(),
                                 &d->placement_);
  if (!sched.ok()) return sched.status();
  d->scheduler_ = std::move(*sched);
  auto authz = Authorizer::Create(options.token_file);
  if (!authz.ok()) return authz.status();
  d->authz_ = std::move(*authz);
  LogAuthMode("scheduler", *d->authz_, options.tls.enabled() && !options.tls.ca.empty());
  d->service_ = std::make_unique<SchedulerService>(d->scheduler_.get(), d->authz_.get());
  d->service_->ObserveLatency(d->scheduler_->mutable_metrics(), "pscluster_scheduler_rpc_seconds");
  d->service_->ObserveAudit(d->scheduler_->mutable_metrics(),
                            "pscluster_scheduler_audit_calls_total");
  if (!options.audit_log.empty()) {
    auto audit = AuditLog::Open(options.audit_log);
    if (!audit.ok()) return audit.status();
    d->audit_ = std::move(*audit);
    d->service_->SetAuditLog(d->audit_.get());
  }
  SchedulerDaemon* self = d.get();
  d->scheduler_->OnServingChanged([self](bool serving) {
    absl::MutexLock l(&self->health_mu_);
    self->store_serving_ = serving;
    if (self->health_server_ != nullptr) self->health_server_->SetServing(serving);
  });

  GrpcServerOptions server_options;
  server_options.listen_address = options.listen_address;
  server_options.port_file = options.port_file;
  server_options.tls = options.tls;
  server_options.component = "scheduler";
  // The control loop runs before the port file appears, so that whoever waits for it finds a
  // scheduler that is already placing jobs.
  d->scheduler_->Start();
  auto server = GrpcServer::Start(server_options, {d->service_.get()});
  if (!server.ok()) {
    d->scheduler_->Stop();
    return server.status();
  }
  d->server_ = std::move(*server);
  {
    absl::MutexLock l(&d->health_mu_);
    d->health_server_ = d->server_.get();
    d->server_->SetServing(d->store_serving_);
  }
  if (options.scheduler_term > 0) {  // One of several schedulers over etcd, leading.
    d->scheduler_->mutable_metrics()
        ->AddGauge("pscluster_scheduler_leading",
                   "1 while this scheduler leads (its daemon's /metrics), 0 while it follows.")
        ->Set(1);
    d->scheduler_->mutable_metrics()
        ->AddGauge("pscluster_scheduler_term",
                   "The leader's term: the etcd revision of its election (its fencing token).")
        ->Set(static_cast<double>(options.scheduler_term));
  }
  if (!options.metrics_address.empty()) {
    auto metrics = MetricsHttpServer::Start(options.metrics_address, &d->scheduler_->metrics());
    if (!metrics.ok()) {
      d->Shutdown();
      return metrics.status();
    }
    d->metrics_ = std::move(*metrics);
    Logger("scheduler")->info("metrics at http://{}:{}/metrics",
                              options.metrics_address.substr(0, options.metrics_address.rfind(':')),
                              d->metrics_->port());
  }
  if (!options.http_address.empty()) {
    d->status_http_ = std::make_unique<StatusHttp>(
        d->scheduler_.get(), d->authz_->enabled() ? d->authz_.get() : nullptr);
    HttpServerOptions http_options;
    http_options.address = options.http_address;
    http_options.flag = "--http_listen";
    StatusHttp* page = d->status_http_.get();
    auto http = HttpServer::Start(http_options,
                                  [page](const HttpRequest& req) { return page->Handle(req); });
    if (!http.ok()) {
      d->Shutdown();
      return http.status();
    }
    d->http_ = std::move(*http);
    Logger("scheduler")->info("status page at http://{}:{}/{}",
                              options.http_address.substr(0, options.http_address.rfind(':')),
                              d->http_->port(),
                              d->authz_->enabled() ? " (the API asks for a viewer token)" : "");
  }
  Logger("scheduler")->info("scheduler {} serving on {} with database {}",
                            options.scheduler.version, d->server_->address(), options.db_path);
  return d;
}

absl::Status SchedulerDaemon::ReloadQuotas() {
  if (quota_file_.empty()) return absl::OkStatus();
  auto quotas = Quotas::Load(quota_file_);
  if (!quotas.ok()) return quotas.status();
  scheduler_->SetQuotas(std::make_shared<const Quotas>(std::move(*quotas)));
  return absl::OkStatus();
}

SchedulerDaemon::~SchedulerDaemon() { Shutdown(); }

void SchedulerDaemon::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  http_.reset();  // Before the scheduler it reads from.
  metrics_.reset();
  {
    absl::MutexLock l(&health_mu_);
    health_server_ = nullptr;
  }
  if (server_) server_->Shutdown(grace);
  if (scheduler_) scheduler_->Stop();
}

}  // namespace pscluster::scheduler
