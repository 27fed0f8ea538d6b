// The ps_server daemon as a library: the options struct its flags fill, and the object that
// owns the handler, executors, gRPC server and scheduler link.
//
// Thread model: gRPC callback threads receive; `data` executor threads apply pushes and serve
// reads; one `control` thread runs control-plane calls; one `background` thread writes periodic
// checkpoints; one thread ticks rates (standalone) or heartbeats (with a scheduler).
#ifndef PSCLUSTER_SERVER_PS_SERVER_H_
#define PSCLUSTER_SERVER_PS_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/executor.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "common/scheduler_term.h"
#include "common/audit_log.h"
#include "common/authz.h"
#include "common/tls.h"
#include "server/data_stream.h"
#include "server/ps_handler.h"
#include "server/ps_service.h"
#include "server/scheduler_link.h"
#include "server/tcp_data_server.h"
#include "server/wire.h"

namespace pscluster {

struct PsServerOptions {
  std::string listen = "127.0.0.1:0";  // --listen
  // --advertise_host: host workers and the scheduler reach this server at (default: the --listen
  // host; 127.0.0.1 when listening on all interfaces).
  std::string advertise_host;
  std::string port_file;               // --port_file
  std::string scheduler;               // --scheduler (empty = standalone)
  uint64_t memory_bytes = 0;           // --memory_bytes (0 = HostMemoryBytes())
  std::string spill_dir;               // --spill_dir (empty = no disk tier)
  std::string checkpoint_dir;          // --checkpoint_dir
  // --checkpoint_root / --export_root: the directories every checkpoint directory and restored
  // file / every export must lie in (common/path_root.h); empty = anywhere.
  std::string checkpoint_root;
  std::string export_root;
  TlsFiles tls;                        // --tls_cert / --tls_key / --tls_ca
  // --token_file: identities and roles of callers (common/token_file.h); empty = every call is
  // allowed. When set, the TCP/Unix data plane stays closed (it does not authenticate yet).
  std::string token_file;
  // --audit_log: calls that change state, and refused calls, as JSON lines (common/audit_log.h);
  // empty = none.
  std::string audit_log;
  // The token this server sends to the scheduler and to other servers (--credential_file's
  // content); empty = none.
  std::string credential;
  int data_threads = 0;                // --data_threads (0 = one per core)
  // --data_port: port of the plaintext TCP data plane on the --listen host (0: chosen by the OS;
  // -1: none, clients use gRPC PushPull). Never opened with TLS or a token file.
  int data_port = 0;
  // --data_spin_us: how long a TCP data connection's reader checks an empty socket before it
  // sleeps.
  absl::Duration data_spin = absl::Microseconds(50);
  // --data_auth_timeout: a TCP/Unix data connection must authenticate (under TLS, finish its
  // handshake first) within this time, or it is logged and closed. REQUIRES: > 0.
  absl::Duration data_auth_timeout = absl::Seconds(30);
  // --data_inline_bytes: TCP data connections apply chunks up to this size on their reader
  // thread when the call has nothing queued (no hand-off to a data thread; the reply is sent
  // from the same thread). Replaces data_plane.inline_bytes for those connections.
  size_t data_inline_bytes = 4 << 20;
  // --data_unix: with the TCP data port, also serve the data plane on an abstract Unix socket for
  // workers on the same host (they check its peer is this process).
  bool data_unix = true;
  // --data_shm_mib: shared memory a worker on this host may attach to its Unix data connection
  // for the payloads (both rings together; 0 = none, payloads go over the socket).
  size_t data_shm_max_bytes = 256u << 20;
  absl::Duration register_timeout = absl::Seconds(30);  // --register_timeout
  std::string metrics_listen;          // --metrics_listen (empty = no /metrics endpoint)
  DataPlaneOptions data_plane;
  // gRPC channel arguments of the server (default: DataPlaneChannelArgs()).
  std::vector<std::pair<std::string, int>> grpc_args = *DataPlaneChannelArgs();
  DataPlaneLimits limits;
  // Replication: how long a call to a backup is retried before the pushes it carries fail.
  absl::Duration replication_retry = absl::Seconds(10);
};

class PsServer {
 public:
  // Listens, registers (when a scheduler is given) and serves. UNAVAILABLE from registration is
  // the retryable fault the daemon exits 138 for.
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(const PsServerOptions& options,
                                                         const Clock* clock);
  ~PsServer();

  const std::string& address() const { return grpc_->address(); }
  // Port of the TCP data plane (0 when off).
  int data_port() const { return tcp_ ? tcp_->port() : 0; }
  // The data plane's abstract Unix socket name (empty: none) and its open connections.
  std::string data_unix() const { return tcp_ ? tcp_->unix_name() : std::string(); }
  int data_unix_connections() const { return tcp_ ? tcp_->unix_connections() : 0; }
  int data_shm_connections() const { return tcp_ ? tcp_->shm_connections() : 0; }
  // Payload bytes received and sent through shared memory.
  uint64_t data_shm_bytes_received() const { return tcp_ ? tcp_->shm_bytes_received() : 0; }
  uint64_t data_shm_bytes_sent() const { return tcp_ ? tcp_->shm_bytes_sent() : 0; }
  int data_connections() const { return tcp_ ? tcp_->connections() : 0; }
  // Data connections refused since the start, by reason (null when the data plane is off).
  const TcpDataServer::Refusals* data_refusals() const {
    return tcp_ ? &tcp_->refusals() : nullptr;
  }
  // host:port of the Prometheus endpoint (empty when off).
  std::string metrics_address() const {
    return metrics_ ? absl::StrCat("127.0.0.1:", metrics_->port()) : "";
  }
  PsHandler* handler() { return handler_.get(); }
  // Reads the token file again (SIGHUP); on error the previous one stays in force.
  absl::Status ReloadTokenFile() { return authz_->Reload(); }
  // Deregisters, stops accepting calls and lets in-flight ones finish (within `grace`).
  void Shutdown(absl::Duration grace = absl::Seconds(2));

 private:
  PsServer() = default;

  // First: the handler, the service and the data plane observe into its histograms until they
  // are gone.
  MetricsRegistry registry_;
  std::unique_ptr<Executor> data_;
  std::unique_ptr<Executor> control_;
  std::unique_ptr<Executor> replica_;  // Replicate calls from the primaries this server backs.
  std::unique_ptr<Executor> background_;
  std::unique_ptr<PsHandler> handler_;
  std::unique_ptr<Authorizer> authz_;
  std::unique_ptr<AuditLog> audit_;
  // Refuses the calls of a deposed scheduler (common/scheduler_term.h).
  SchedulerTermFence fence_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<TcpDataServer> tcp_;
  std::unique_ptr<SchedulerLink> link_;
  std::unique_ptr<MetricsHttpServer> metrics_;
  absl::Notification stop_ticks_;
  std::thread ticker_;
  bool shut_down_ = false;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_PS_SERVER_H_
