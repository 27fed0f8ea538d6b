// ps_worker assembled, as the scheduler's and the server's daemons are: the scheduler client,
// the WorkerNode (register, heartbeat, run the assigned tasks with Trainer), the WorkerControl
// gRPC service with its authorizer, and the Prometheus /metrics endpoint. main.cc fills
// WorkerDaemonOptions from flags (and runs the standalone mode itself); tests build the same
// daemon in-process.
#ifndef PSCLUSTER_WORKER_WORKER_DAEMON_H_
#define PSCLUSTER_WORKER_WORKER_DAEMON_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/audit_log.h"
#include "common/authz.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "common/scheduler_term.h"
#include "worker/entrypoint_runner.h"
#include "worker/scheduler_client.h"
#include "worker/task_logs.h"
#include "worker/trainer.h"
#include "worker/worker_node.h"
#include "worker/worker_service.h"

namespace pscluster::worker {

struct WorkerDaemonOptions {
  std::string scheduler_address;                 // host:port of ps_scheduler (required).
  std::string listen_address = "127.0.0.1:0";   // WorkerControl (port 0 = any).
  std::string advertise_host;                    // Host the scheduler calls ("" = the listen one).
  std::string port_file;                         // "host:port" written here once serving.
  std::string metrics_address;                   // /metrics ("" = none).
  // Identities and roles of callers (common/token_file.h); empty = every call is allowed.
  std::string token_file;
  // Calls that change state, and refused calls, as JSON lines (common/audit_log.h); "" = none.
  std::string audit_log;
  int cpu_slots = 1;                             // Training tasks offered.
  uint64_t memory_bytes = 0;                     // Offered (0 = physical memory).
  absl::Duration registration_timeout = absl::Seconds(60);
  // Every task's trainer; its channel (TLS, credential) is also this daemon's own.
  TrainerOptions trainer;
  // Tasks of jobs with an entrypoint (the user's command); off unless entrypoint.allow. The
  // daemon fills in the scheduler's address and the output log book.
  EntrypointOptions entrypoint;
  // Called (once, from a node thread) when the node gives up (it could not register in time):
  // the process should exit with a retryable code.
  std::function<void(absl::Status)> on_fatal;
};

class WorkerDaemon {
 public:
  // Probes CUDA, starts serving and registering. Errors name the flag or file at fault.
  static absl::StatusOr<std::unique_ptr<WorkerDaemon>> Start(WorkerDaemonOptions options);
  ~WorkerDaemon();

  // Stops serving and the node (its running task, if any); idempotent.
  void Shutdown();
  // Reads the token file again (SIGHUP); on error the previous one stays in force.
  absl::Status ReloadTokenFile() { return authz_->Reload(); }

  // What the scheduler calls this worker at.
  const std::string& address() const { return address_; }
  // Port of the /metrics endpoint (0 when it is off).
  int metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }
  // The device the node offers ("cpu" or "cuda (N x NAME)").
  const std::string& device() const { return device_; }
  WorkerNode& node() { return *node_; }

 private:
  WorkerDaemon() = default;
  void AddStatusGauges();

  MetricsRegistry metrics_;
  TaskLogBook task_logs_;  // Output of entrypoint tasks; before the node, which writes it.
  std::unique_ptr<Authorizer> authz_;
  std::unique_ptr<AuditLog> audit_;
  // Refuses the calls of a deposed scheduler (common/scheduler_term.h).
  SchedulerTermFence fence_;
  std::unique_ptr<SchedulerClient> scheduler_;
  std::unique_ptr<WorkerNode> node_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<MetricsHttpServer> metrics_server_;
  std::string address_;
  std::string device_;
  bool shut_down_ = false;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_WORKER_DAEMON_H_
