// ps_scheduler assembled: the SQLite store, the gRPC clients to servers and workers, the
// Scheduler handler with its control loop, and the gRPC server (Scheduler service, health,
// reflection). main.cc fills SchedulerDaemonOptions from flags; tests and benchmarks build the
// same daemon in-process.
#ifndef PSCLUSTER_SCHEDULER_SCHEDULER_DAEMON_H_
#define PSCLUSTER_SCHEDULER_SCHEDULER_DAEMON_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/audit_log.h"
#include "common/authz.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "common/tls.h"
#include "scheduler/grpc_cluster_rpc.h"
#include "scheduler/placement.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_service.h"
#include "scheduler/status_http.h"
#include "scheduler/store.h"

namespace pscluster::scheduler {

struct SchedulerDaemonOptions {
  std::string listen_address = "127.0.0.1:7070";
  std::string port_file;        // "host:port" written here once listening.
  std::string db_path;          // SQLite database (created if missing).
  bool db_full_sync = true;     // fsync every commit.
  TlsFiles tls;                 // Server side; also presented to servers and workers.
  // Identities and roles of callers (common/token_file.h); empty = every call is allowed.
  std::string token_file;
  // Quotas per identity (quotas.h; re-read by ReloadQuotas); empty = none. Needs token_file.
  std::string quota_file;
  // Calls that change state (SubmitJob, CancelJob, MoveShard, CheckpointJob, ExportJob) and
  // refused calls, as JSON lines (common/audit_log.h); "" = none.
  std::string audit_log;
  std::string credential;       // Token sent to servers and workers (empty = none).
  absl::Duration rpc_timeout = absl::Seconds(5);  // Deadline of calls to servers and workers.
  std::string metrics_address;  // host:port of the Prometheus /metrics endpoint ("" = none).
  // host:port of the web status page and its JSON (status_http.h) ("" = none). Plain HTTP: with
  // TLS on it must be a loopback address (tokens would otherwise cross the network in clear).
  std::string http_address;
  // The leader's term when one of several schedulers over etcd (ha_scheduler.h), sent with every
  // call to servers and workers (common/scheduler_term.h); 0 = the only scheduler.
  int64_t scheduler_term = 0;
  SchedulerOptions scheduler;
};

class SchedulerDaemon {
 public:
  // Opens the database, restores the state, starts listening and the control loop.
  // `clock` = nullptr uses the real clock; `store` = nullptr opens options.db_path (tests pass
  // a store that fails on demand). Errors name the flag or file at fault.
  static absl::StatusOr<std::unique_ptr<SchedulerDaemon>> Start(
      const SchedulerDaemonOptions& options, const Clock* clock = nullptr,
      std::unique_ptr<Store> store = nullptr);
  ~SchedulerDaemon();

  // Stops accepting calls (giving those in flight `grace`), stops the control loop and writes
  // the last progress.
  void Shutdown(absl::Duration grace = absl::Seconds(2));

  // Reads the token file again (SIGHUP); on error the previous one stays in force.
  absl::Status ReloadTokenFile() { return authz_->Reload(); }
  // Reads the quota file again; on error the previous quotas stay in force.
  absl::Status ReloadQuotas();

  const std::string& address() const { return server_->address(); }
  // Port of the /metrics endpoint (0 when it is off).
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  // Port of the web status page (0 when it is off).
  int http_port() const { return http_ ? http_->port() : 0; }
  Scheduler& scheduler() { return *scheduler_; }

 private:
  SchedulerDaemon() = default;

  RealClock real_clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<GrpcClusterRpc> rpc_;
  CapacityPlacement placement_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Authorizer> authz_;
  std::unique_ptr<AuditLog> audit_;
  std::unique_ptr<SchedulerService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<MetricsHttpServer> metrics_;
  std::unique_ptr<StatusHttp> status_http_;
  std::unique_ptr<HttpServer> http_;
  std::string quota_file_;
  bool shut_down_ = false;
  // gRPC health follows the store (Scheduler::OnServingChanged), which may change from the
  // control loop before the server exists.
  absl::Mutex health_mu_;
  GrpcServer* health_server_ ABSL_GUARDED_BY(health_mu_) = nullptr;
  bool store_serving_ ABSL_GUARDED_BY(health_mu_) = true;
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_SCHEDULER_DAEMON_H_
