#include "server/ps_server.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/address.h"
#include "common/atomic_file.h"
#include "common/authz.h"
#include "common/channel.h"
#include "common/host_memory.h"
#include "common/logging.h"
#include "common/path_root.h"
#include "common/status_convert.h"
#include "server/network_backup_transport.h"
#include "server/ps_metrics.h"
#include "server/row_store.h"
#include "server/tcp_frame.h"
#include "server/tls_stream.h"
#include "server/wire.h"

namespace pscluster {

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(const PsServerOptions& options,
                                                          const Clock* clock) {
  std::unique_ptr<PsServer> s(new PsServer());
  int threads = options.data_threads > 0
                    ? options.data_threads
                    : std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  s->data_ = std::make_unique<Executor>(threads, "data");
  s->control_ = std::make_unique<Executor>(1, "control");
  s->replica_ = std::make_unique<Executor>(2, "replica");
  s->background_ = std::make_unique<Executor>(1, "background");
  // 0: what this machine (or its container) has, so that a table that cannot fit is refused
  // instead of taking the process down when its pages run out.
  const uint64_t memory = options.memory_bytes != 0 ? options.memory_bytes : HostMemoryBytes();
  PsHandlerOptions ho;
  ho.checkpoint_dir = options.checkpoint_dir;
  if (!options.checkpoint_root.empty()) {
    auto root = ResolveRoot(options.checkpoint_root, "--checkpoint_root");
    if (!root.ok()) return root.status();
    ho.checkpoint_root = *root;
  }
  if (!options.export_root.empty()) {
    auto root = ResolveRoot(options.export_root, "--export_root");
    if (!root.ok()) return root.status();
    ho.export_root = *root;
  }
  if (!options.checkpoint_dir.empty()) {
    absl::Status in_root =
        CheckUnderRoot(options.checkpoint_dir, ho.checkpoint_root, "--checkpoint_dir");
    if (!in_root.ok()) return in_root;
  }
  ho.memory_bytes = memory;
  if (!options.spill_dir.empty() && access(options.spill_dir.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--spill_dir ", options.spill_dir, ": not a writable directory (", std::strerror(errno),
        "); the disk tier of sparse tables needs one"));
  }
  if (!options.spill_dir.empty()) {
    // Disk tiers of killed servers (their databases' locks died with them) are only garbage.
    auto removed = RowStore::RemoveAbandoned(options.spill_dir);
    if (!removed.ok()) return removed.status();
    for (const std::string& dir : *removed) {
      Logger("server")->warn("--spill_dir: removed {}, the disk tier of a server that is gone",
                             dir);
    }
  }
  ho.spill_dir = options.spill_dir;
  ho.limits = options.limits;
  ho.replication_retry = options.replication_retry;
  Executor* bg = s->background_.get();
  s->handler_ = std::make_unique<PsHandler>(ho, clock, [bg](std::function<void()> f) {
    bg->Post(std::move(f));
  });
  auto authz = Authorizer::Create(options.token_file);
  if (!authz.ok()) return authz.status();
  s->authz_ = std::move(*authz);
  LogAuthMode("server", *s->authz_, options.tls.enabled() && !options.tls.ca.empty());
  PsHandler* handler = s->handler_.get();
  s->handler_->set_backup_transport(NewNetworkBackupTransport(
      options.tls, options.credential,
      [handler](const std::string& job_id) { return handler->DataSecret(job_id); }));
  s->service_ = std::make_unique<PsService>(s->handler_.get(), s->data_.get(), s->control_.get(),
                                            options.data_plane, s->replica_.get(),
                                            s->authz_.get());
  s->service_->ObserveLatency(&s->registry_, "pscluster_server_rpc_seconds");
  s->service_->ObserveAudit(&s->registry_, "pscluster_server_audit_calls_total");
  s->service_->SetSchedulerTermFence(&s->fence_);
  if (!options.audit_log.empty()) {
    auto audit = AuditLog::Open(options.audit_log);
    if (!audit.ok()) return audit.status();
    s->audit_ = std::move(*audit);
    s->service_->SetAuditLog(s->audit_.get());
  }
  GrpcServerOptions go;
  go.listen_address = options.listen;
  go.tls = options.tls;
  go.component = "server";
  go.int_args = options.grpc_args;
  // Data-plane chunks are about 4 MiB; leave room above the largest accepted chunk.
  go.max_message_bytes =
      static_cast<int>(std::max<uint64_t>(64 << 20, options.limits.max_chunk_bytes + (1 << 20)));
  // The port file is written only after registration, so a launcher that sees it can use the
  // server right away.
  auto grpc = GrpcServer::Start(go, {s->service_.get()});
  if (!grpc.ok()) return grpc.status();
  s->grpc_ = std::move(*grpc);
  const std::string advertised =
      options.advertise_host.empty()
          ? s->grpc_->address()
          : absl::StrCat(options.advertise_host, ":", s->grpc_->port());
  s->handler_->set_address(advertised);
  if (options.data_port >= 0) {
    TcpDataServerOptions to;
    if (options.tls.enabled()) {
      // The data port speaks TLS with the gRPC port's certificates.
      auto tls = TlsContext::ForServer(options.tls);
      if (!tls.ok()) {
        s->grpc_->Shutdown(absl::ZeroDuration());
        return absl::Status(tls.status().code(),
                            absl::StrCat("TLS data port: ", tls.status().message()));
      }
      to.tls = std::move(*tls);
    }
    // With --token_file every data connection proves a job's data secret.
    to.require_auth = s->authz_->enabled();
    std::string port;
    absl::Status st = SplitHostPort(options.listen, &to.host, &port);
    if (!st.ok()) {
      s->grpc_->Shutdown(absl::ZeroDuration());
      return absl::InvalidArgumentError(absl::StrCat("--listen: ", st.message()));
    }
    to.port = options.data_port;
    to.spin = options.data_spin;
    to.auth_timeout = options.data_auth_timeout;
    to.shm_max_bytes = options.data_shm_max_bytes;
    if (options.data_unix) {
      // Unique per process and server (tests run several servers in one process).
      static std::atomic<int> next{0};
      to.unix_name = absl::StrCat("pscluster-data/", getpid(), "/", next.fetch_add(1));
    }
    to.max_frame_bytes = static_cast<uint32_t>(
        std::min<uint64_t>(kMaxFrameBytes, options.limits.max_chunk_bytes + (1 << 20)));
    DataPlaneOptions tcp_plane = options.data_plane;
    tcp_plane.inline_bytes = options.data_inline_bytes;
    auto tcp = TcpDataServer::Start(to, s->handler_.get(), s->data_.get(), BufferPool::Create(),
                                    tcp_plane);
    if (!tcp.ok()) {
      s->grpc_->Shutdown(absl::ZeroDuration());
      return tcp.status();
    }
    s->tcp_ = std::move(*tcp);
    s->handler_->set_data_port(static_cast<uint32_t>(s->tcp_->port()));
    s->handler_->set_data_unix(s->tcp_->unix_name());
  }
  if (!options.metrics_listen.empty()) {
    RegisterServerMetrics(s->handler_.get(), &s->registry_);
    SchedulerTermFence* fence = &s->fence_;
    s->registry_.AddGaugeCallback(
        "pscluster_server_scheduler_term",
        "Highest scheduler term (etcd revision of the leader's election) seen; 0 with one "
        "scheduler.",
        [fence] { return std::vector<Sample>{{"", double(fence->term())}}; });
    s->registry_.AddCounterCallback(
        "pscluster_server_deposed_scheduler_calls_total",
        "Calls refused because they came from a deposed scheduler (a lower term).",
        [fence] { return std::vector<Sample>{{"", double(fence->refused())}}; });
    if (s->tcp_) {
      // The data server outlives the metrics endpoint (Shutdown() stops the endpoint first).
      TcpDataServer* t = s->tcp_.get();
      s->registry_.AddGaugeCallback(
          "pscluster_server_data_connections",
          "Open connections of the TCP data plane by how their payloads travel: tcp (the data "
          "port), unix (the Unix socket), shm (the Unix socket with shared memory).",
          [t]() {
            const TcpDataServer::ConnectionCounts n = t->CountConnections();
            return std::vector<Sample>{{"transport=\"tcp\"", double(n.tcp)},
                                       {"transport=\"unix\"", double(n.unix_socket)},
                                       {"transport=\"shm\"", double(n.shm)}};
          });
      s->registry_.AddCounterCallback(
          "pscluster_server_data_connections_refused_total",
          "Data connections closed for what the peer sent or did not prove, by reason: "
          "tls_handshake, tls_record (a record that failed its check, one in the clear, an "
          "alert), auth (the job's data secret), frame (a malformed frame), limit (the data "
          "plane's 256 open connections).",
          [t]() {
            const TcpDataServer::Refusals& r = t->refusals();
            return std::vector<Sample>{{"reason=\"tls_handshake\"", double(r.tls_handshake)},
                                       {"reason=\"tls_record\"", double(r.tls_record)},
                                       {"reason=\"auth\"", double(r.auth)},
                                       {"reason=\"frame\"", double(r.frame)},
                                       {"reason=\"limit\"", double(r.limit)}};
          });
      s->registry_.AddCounterCallback(
          "pscluster_server_shm_payload_bytes_total",
          "Payload bytes passed through shared memory with workers on this host.", [t]() {
            return std::vector<Sample>{{"direction=\"received\"", double(t->shm_bytes_received())},
                                       {"direction=\"sent\"", double(t->shm_bytes_sent())}};
          });
    }
    auto m = MetricsHttpServer::Start(options.metrics_listen, &s->registry_);
    if (!m.ok()) {
      s->grpc_->Shutdown(absl::ZeroDuration());
      return absl::Status(m.status().code(),
                          absl::StrCat("--metrics_listen: ", m.status().message()));
    }
    s->metrics_ = std::move(*m);
    Logger("server")->info("Prometheus metrics on port {} (/metrics)", s->metrics_->port());
  }
  if (!options.scheduler.empty()) {
    if (auto w = LoopbackAdvertiseWarning(advertised, options.scheduler)) {
      Logger("server")->warn("{}", *w);
    }
    SchedulerLinkOptions lo;
    lo.scheduler = options.scheduler;
    lo.advertise_address = advertised;
    lo.memory_bytes = memory;
    lo.channel.tls = options.tls;
    lo.channel.bearer_token = options.credential;
    lo.register_timeout = options.register_timeout;
    s->link_ = std::make_unique<SchedulerLink>(lo, s->handler_.get());
    absl::Status st = s->link_->Start();
    if (!st.ok()) {
      s->grpc_->Shutdown(absl::ZeroDuration());
      return st;
    }
  } else {
    PsHandler* h = s->handler_.get();
    absl::Notification* stop = &s->stop_ticks_;
    s->ticker_ = std::thread([h, stop] {
      while (!stop->WaitForNotificationWithTimeout(absl::Seconds(1))) h->Tick(nullptr, nullptr);
    });
  }
  if (!options.port_file.empty()) {
    absl::Status st = WriteFileAtomically(options.port_file, s->grpc_->address() + "\n");
    if (!st.ok()) {
      s->Shutdown(absl::ZeroDuration());
      return absl::Status(st.code(), absl::StrCat("--port_file: ", st.message()));
    }
  }
  Logger("server")->info("ps_server serving on {} ({}; {} data threads; TCP data port {})",
                         s->grpc_->address(),
                         options.scheduler.empty() ? std::string("standalone")
                                                   : "scheduler " + options.scheduler,
                         threads,
                         !s->tcp_ ? std::string("off")
                         : !options.tls.enabled()
                             ? std::to_string(s->tcp_->port())
                             : absl::StrCat(s->tcp_->port(), ", TLS records ",
                                            TlsIo::UsesVectorAes()
                                                ? "in AES-GCM on the CPU's VAES/VPCLMULQDQ"
                                                : "by OpenSSL (--tls_vector_aes=false or no "
                                                  "VAES/VPCLMULQDQ on this CPU)"));
  return s;
}

void PsServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  if (link_) link_->Stop();
  if (ticker_.joinable()) {
    stop_ticks_.Notify();
    ticker_.join();
  }
  if (tcp_) tcp_->Shutdown();
  if (grpc_) grpc_->Shutdown(grace);
  metrics_.reset();
}

PsServer::~PsServer() {
  Shutdown(absl::ZeroDuration());
  // Executors join after the gRPC server stopped, so no reactor posts work any more.
  tcp_.reset();
  data_.reset();
  control_.reset();
  replica_.reset();
  background_.reset();
}

}  // namespace pscluster
