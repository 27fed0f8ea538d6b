// ps_server: the parameter-server daemon. Flags fill PsServerOptions; everything else is in
// server/ps_server.h.
//
// SIGHUP reads --token_file again. Exit codes: 0 after SIGTERM/SIGINT, 1 on a configuration or
// startup error, 138 on a retryable fault (the scheduler could not be reached to register), 2 for
// bad flags.
#include <signal.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/token_file.h"
#include "server/ps_server.h"
#include "server/tls_stream.h"
#include "server/wire.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve on (port 0 = any free port)");
ABSL_FLAG(std::string, advertise_host, "",
          "host workers and the scheduler reach this server at (default: the --listen host; "
          "127.0.0.1 when listening on all interfaces)");
ABSL_FLAG(std::string, port_file, "", "write host:port here once serving (and registered)");
ABSL_FLAG(std::string, scheduler, "",
          "host:port of ps_scheduler to register and heartbeat with (several, comma-separated, or "
          "dns:///NAME:PORT: schedulers sharing etcd, the leader is followed); empty = standalone");
ABSL_FLAG(uint64_t, memory_bytes, 0,
          "bytes of parameters and optimizer state this server may hold (0 = this machine's memory, "
          "or its container's limit)");
ABSL_FLAG(std::string, checkpoint_dir, "", "default directory for checkpoints");
ABSL_FLAG(std::string, checkpoint_root, "",
          "directory every checkpoint directory and restored checkpoint file must lie in "
          "(requests naming another path are refused); empty = anywhere");
ABSL_FLAG(std::string, export_root, "",
          "directory every export must be written in (requests naming another path are "
          "refused); empty = anywhere");
ABSL_FLAG(std::string, spill_dir, "",
          "directory for the disk tier of sparse tables: when --memory_bytes runs short, their "
          "coldest rows (untouched lately, pushed least often) move there (RocksDB) instead of "
          "pushes being refused; "
          "empty = no disk tier");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical or off");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain (enables TLS with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle: requires and verifies client certificates");
ABSL_FLAG(std::string, token_file, "",
          "identities and roles allowed to call this server: lines 'SHA256_HEX_OF_TOKEN|- "
          "IDENTITY ROLE[,ROLE...]' (re-read on SIGHUP); empty = no authentication (a warning "
          "is logged); when set, the TCP/Unix data port stays closed");
ABSL_FLAG(std::string, audit_log, "",
          "append a JSON line per call that changes state (CreateTables, UpdateShardMap, DropJob, "
          "Checkpoint, Restore, Export, FenceWorker) and per refused call to this file; empty = "
          "none");
ABSL_FLAG(std::string, credential_file, "",
          "file holding the token this server sends to the scheduler and to other servers (its "
          "identity needs roles node and server)");
ABSL_FLAG(int, data_threads, 0, "threads applying pushes and serving pulls (0 = one per core)");
ABSL_FLAG(int, data_port, 0,
          "port of the TCP data plane on the --listen host (0 = any free port, -1 = "
          "none: workers use gRPC); in TLS with --tls_cert/--tls_key (client certificates "
          "required with --tls_ca); each connection proves its job's data secret (with "
          "--token_file, always)");
ABSL_FLAG(int, data_spin_us, 50,
          "TCP data plane: a connection's reader checks an empty socket this long before it "
          "sleeps (0 = never; saves waking an idle core between the chunks of a round)");
ABSL_FLAG(bool, tls_vector_aes, true,
          "TLS data plane: seal and open AES-GCM records with this CPU's vector AES and "
          "carry-less multiply instructions (VAES, VPCLMULQDQ; on AVX-512 or AVX2) where it "
          "has them, 2-4x OpenSSL 3.0's rate; false: OpenSSL does every record (e.g. where only a "
          "validated OpenSSL module may do the crypto)");
ABSL_FLAG(absl::Duration, data_auth_timeout, absl::Seconds(30),
          "TCP/Unix data plane: a connection must authenticate (in TLS, finish its handshake "
          "first) within this time, or it is logged and closed (e.g. 30s, 500ms; more than 0, "
          "at most 24h)");
ABSL_FLAG(int, register_timeout_sec, 30,
          "give up registering with --scheduler after this long (exit 138, retryable)");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port for a Prometheus /metrics endpoint (port 0 = any; empty = none)");
ABSL_FLAG(std::string, grpc_args, "",
          "extra gRPC channel arguments, name=value;name=value (expert tuning)");
ABSL_FLAG(uint64_t, inline_bytes, 64 << 10,
          "gRPC data plane: chunks up to this size are applied on the receiving thread (expert "
          "tuning)");
ABSL_FLAG(bool, data_unix, true,
          "with the TCP data port, also serve the data plane on an abstract Unix socket for "
          "workers on the same host (false = TCP only)");
ABSL_FLAG(uint64_t, data_shm_mib, 256,
          "largest shared memory, in MiB, a worker on this host may attach to its Unix data "
          "connection so that payloads bypass the socket (0 = none)");
ABSL_FLAG(uint64_t, data_inline_bytes, 4 << 20,
          "TCP data plane: chunks up to this size are applied on the connection's reader thread "
          "when its call has nothing queued (0 = always hand off to a data thread)");
ABSL_FLAG(uint64_t, max_chunk_bytes, 16 << 20, "largest payload accepted in one chunk");

namespace {

constexpr int kExitRetryable = 138;

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("ps_server: pscluster parameter-server daemon");
  absl::ParseCommandLine(argc, argv);
  pscluster::DisableMutexDeadlockDetection();
  auto log = pscluster::Logger("server");
  absl::Status st = pscluster::SetLogLevel(absl::GetFlag(FLAGS_log_level));
  if (!st.ok()) {
    log->error("{}", st);
    return 2;
  }
  pscluster::PsServerOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.port_file = absl::GetFlag(FLAGS_port_file);
  o.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  o.scheduler = absl::GetFlag(FLAGS_scheduler);
  o.memory_bytes = absl::GetFlag(FLAGS_memory_bytes);
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  o.export_root = absl::GetFlag(FLAGS_export_root);
  o.spill_dir = absl::GetFlag(FLAGS_spill_dir);
  o.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls.key = absl::GetFlag(FLAGS_tls_key);
  o.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  o.token_file = absl::GetFlag(FLAGS_token_file);
  o.audit_log = absl::GetFlag(FLAGS_audit_log);
  if (!absl::GetFlag(FLAGS_credential_file).empty()) {
    auto token = pscluster::ReadCredentialFile(absl::GetFlag(FLAGS_credential_file));
    if (!token.ok()) {
      log->error("--credential_file: {}", token.status());
      return 2;
    }
    o.credential = *token;
  }
  o.data_threads = absl::GetFlag(FLAGS_data_threads);
  o.data_port = absl::GetFlag(FLAGS_data_port);
  o.data_spin = absl::Microseconds(absl::GetFlag(FLAGS_data_spin_us));
  pscluster::TlsIo::SetVectorAes(absl::GetFlag(FLAGS_tls_vector_aes));
  o.data_auth_timeout = absl::GetFlag(FLAGS_data_auth_timeout);
  if (o.data_auth_timeout <= absl::ZeroDuration() || o.data_auth_timeout > absl::Hours(24)) {
    log->error("--data_auth_timeout: must be more than 0 and at most 24h, got {}",
               absl::FormatDuration(o.data_auth_timeout));
    return 2;
  }
  o.register_timeout = absl::Seconds(absl::GetFlag(FLAGS_register_timeout_sec));
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.limits.max_chunk_bytes = absl::GetFlag(FLAGS_max_chunk_bytes);
  o.data_plane.inline_bytes = absl::GetFlag(FLAGS_inline_bytes);
  o.data_inline_bytes = absl::GetFlag(FLAGS_data_inline_bytes);
  o.data_unix = absl::GetFlag(FLAGS_data_unix);
  if (absl::GetFlag(FLAGS_data_shm_mib) > 64 * 1024) {
    log->error("--data_shm_mib: {} MiB is more than the 64 GiB allowed",
               absl::GetFlag(FLAGS_data_shm_mib));
    return 2;
  }
  o.data_shm_max_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_data_shm_mib)) << 20;
  auto grpc_args = pscluster::DataPlaneChannelArgs(absl::GetFlag(FLAGS_grpc_args));
  if (!grpc_args.ok()) {
    log->error("--grpc_args: {}", grpc_args.status().message());
    return 2;
  }
  o.grpc_args = *grpc_args;
  if (o.data_threads < 0 || o.data_threads > 1024) {
    log->error("--data_threads: must be in [0, 1024], got {}", o.data_threads);
    return 2;
  }
  if (absl::GetFlag(FLAGS_data_spin_us) < 0 || absl::GetFlag(FLAGS_data_spin_us) > 100000) {
    log->error("--data_spin_us: must be in [0, 100000], got {}",
               absl::GetFlag(FLAGS_data_spin_us));
    return 2;
  }
  if (o.data_port < -1 || o.data_port > 65535) {
    log->error("--data_port: must be -1 (none), 0 (any) or a port up to 65535, got {}",
               o.data_port);
    return 2;
  }
  if (o.limits.max_chunk_bytes < (1 << 20) || o.limits.max_chunk_bytes > (1u << 30)) {
    log->error("--max_chunk_bytes: must be in [1 MiB, 1 GiB]");
    return 2;
  }

  // Signals are taken by a sigwait below, not by asynchronous handlers; block them before any
  // thread starts so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // A disk tier keeps every table file of its database open (server/row_store.cc): take all the
  // descriptors the hard limit allows (a soft limit of 1,024 is common).
  if (struct rlimit files;
      getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &files) != 0) {
      log->warn("could not raise the limit on open files to {}: {}", files.rlim_max,
                std::strerror(errno));
    }
  }

  pscluster::RealClock clock;
  auto server = pscluster::PsServer::Start(o, &clock);
  if (!server.ok()) {
    log->error("{}", server.status());
    return server.status().code() == absl::StatusCode::kUnavailable && !o.scheduler.empty()
               ? kExitRetryable
               : 1;
  }
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    absl::Status reloaded = (*server)->ReloadTokenFile();
    if (reloaded.ok()) {
      log->info("SIGHUP: token file reloaded");
    } else {
      log->error("SIGHUP: token file not reloaded, the previous one stays: {}", reloaded);
    }
  }
  log->info("signal {}: shutting down", sig);
  (*server)->Shutdown(absl::Seconds(2));
  return 0;
}
