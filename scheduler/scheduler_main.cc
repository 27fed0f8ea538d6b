// ps_scheduler: the pscluster control plane. Flags are defined here only; they fill
// SchedulerDaemonOptions.
#include <signal.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/path_root.h"
#include "common/token_file.h"
#include "scheduler/ha_scheduler.h"
#include "scheduler/scheduler_daemon.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "host:port to serve on; port 0 lets the OS choose (see --port_file)");
ABSL_FLAG(std::string, port_file, "", "write the real host:port here once listening");
ABSL_FLAG(std::string, db, "ps_scheduler.db",
          "SQLite database holding jobs, nodes and shard maps (created if missing)");
ABSL_FLAG(std::string, db_sync, "full",
          "full: fsync every commit (survives power loss); normal: WAL's default (survives a "
          "killed process)");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port serving Prometheus text at /metrics (empty = no metrics endpoint)");
ABSL_FLAG(std::string, http_listen, "",
          "host:port serving the read-only web status page at / and its JSON at /api/ (empty = "
          "no page); with --token_file the JSON needs a viewer token; with TLS only on loopback");
ABSL_FLAG(int64_t, lease_ms, 10000, "heartbeat lease of servers and workers, in milliseconds");
ABSL_FLAG(int64_t, startup_grace_ms, 0,
          "after a start, jobs asking for more nodes than have registered are queued rather than "
          "refused for this long, while nodes re-register (0 = one lease)");
ABSL_FLAG(int64_t, task_stop_grace_ms, 2000,
          "a cancelled or failed job stays on its servers until its workers have stopped their "
          "tasks, or this long");
ABSL_FLAG(int32_t, max_recoveries, 3,
          "times a job recovers from a lost server or worker (a lost worker's rank handed to "
          "another worker, or a rollback to its newest complete checkpoint); one more loss "
          "fails it (0 = a lost node fails its job)");
ABSL_FLAG(int64_t, rpc_timeout_ms, 5000, "deadline of calls to servers and workers");
ABSL_FLAG(int64_t, rebalance_every_ms, 60000,
          "look at running jobs' shard loads this often and move a hot virtual shard off an "
          "overloaded server, live (0 = never)");
ABSL_FLAG(double, rebalance_imbalance, 1.5,
          "a server is overloaded when its bytes/s exceed this many times its job's mean");
ABSL_FLAG(double, rebalance_min_mb_per_sec, 1.0,
          "below this difference (MB/s) between a job's busiest and idlest server nothing moves");
ABSL_FLAG(double, rebalance_bytes_per_request, 32768,
          "what one data-plane request counts for in a shard's load, in bytes (0 = bytes/s alone)");
ABSL_FLAG(int64_t, data_balance_every_ms, 30000,
          "jobs with balance_data: how often their data shares may change to follow the ranks' "
          "compute rates (0 = never)");
ABSL_FLAG(double, data_balance_tolerance, 0.15,
          "jobs with balance_data: shares change when a rank's fraction of the data would change "
          "by more than this fraction of itself");
ABSL_FLAG(int64_t, move_copy_timeout_ms, 60000,
          "a shard move is given up when the target's copy has not caught up within this long");
ABSL_FLAG(std::string, checkpoint_root, "",
          "directory every job's checkpoint_dir and every on-demand checkpoint directory must "
          "lie in; the scheduler reads checkpoints (to find where a job recovers from) only "
          "there; empty = anywhere");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical or off");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain (enables TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle: requires and verifies client certificates (mutual TLS) and verifies "
          "the servers and workers the scheduler calls");
ABSL_FLAG(std::string, audit_log, "",
          "append a JSON line per call that changes state (SubmitJob, CancelJob, MoveShard, "
          "CheckpointJob, ExportJob) and per refused call to this file; empty = none");
ABSL_FLAG(std::string, token_file, "",
          "identities and roles allowed to call the scheduler: lines 'SHA256_HEX_OF_TOKEN|- "
          "IDENTITY ROLE[,ROLE...]' (re-read on SIGHUP); empty = no authentication (a warning "
          "is logged)");
ABSL_FLAG(std::string, quota_file, "",
          "limits per identity of --token_file: lines 'IDENTITY|* JOBS|- SERVER_MEMORY|-' (at "
          "most JOBS unfinished jobs; no new job once its running jobs hold SERVER_MEMORY bytes "
          "on their servers, e.g. 8GiB); past them SubmitJob answers RESOURCE_EXHAUSTED naming "
          "the quota (re-read on SIGHUP; needs --token_file); empty = no quotas");
ABSL_FLAG(std::string, etcd_endpoints, "",
          "host:port[,host:port...] of an etcd cluster's members (client URLs; gRPC, in TLS "
          "with --etcd_ca_file): "
          "the scheduler's state lives there instead of --db, and several schedulers started "
          "with the same endpoints and --etcd_prefix elect one leader; the others answer "
          "UNAVAILABLE naming it until they take over. Empty = one scheduler on --db");
ABSL_FLAG(std::string, etcd_prefix, "/pscluster",
          "with --etcd_endpoints: prefix of this cluster's keys in etcd (one per cluster)");
ABSL_FLAG(int64_t, etcd_lease_seconds, 5,
          "with --etcd_endpoints: the leader's lease; a dead leader is replaced within about "
          "this, and a leader that cannot renew it steps down after 2/3 of it");
ABSL_FLAG(std::string, etcd_ca_file, "",
          "with --etcd_endpoints: PEM CA bundle that verifies the etcd members' certificates "
          "(their --cert-file); set: the scheduler speaks TLS to etcd. Empty = plain gRPC");
ABSL_FLAG(std::string, etcd_cert_file, "",
          "with --etcd_endpoints: PEM client certificate presented to etcd (for its "
          "--client-cert-auth); needs --etcd_key_file");
ABSL_FLAG(std::string, etcd_key_file, "",
          "with --etcd_endpoints: PEM private key of --etcd_cert_file");
ABSL_FLAG(std::string, advertise_address, "",
          "with --etcd_endpoints: host:port other schedulers name as the leader's address "
          "when this one leads (default: --listen, 0.0.0.0 read as 127.0.0.1)");
ABSL_FLAG(std::string, credential_file, "",
          "file holding the token the scheduler sends to servers and workers (its identity "
          "needs role scheduler there)");

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "ps_scheduler: %s\n", std::string(s.message()).c_str());
  // 138: a fault worth retrying (the convention of Kubernetes training operators).
  return s.code() == absl::StatusCode::kUnavailable ? 138 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ps_scheduler --listen=HOST:PORT --db=FILE [--port_file=FILE] [--lease_ms=N]\n"
      "The pscluster scheduler: node registry, job queue, placement, shard maps, status.");
  absl::ParseCommandLine(argc, argv);
  pscluster::DisableMutexDeadlockDetection();
  absl::Status s = pscluster::SetLogLevel(absl::GetFlag(FLAGS_log_level));
  if (!s.ok()) return Fail(s);

  pscluster::scheduler::SchedulerDaemonOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_listen);
  options.http_address = absl::GetFlag(FLAGS_http_listen);
  options.db_path = absl::GetFlag(FLAGS_db);
  std::string sync = absl::GetFlag(FLAGS_db_sync);
  if (sync != "full" && sync != "normal") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--db_sync: '", sync, "' must be full or normal")));
  }
  options.db_full_sync = sync == "full";
  int64_t lease_ms = absl::GetFlag(FLAGS_lease_ms);
  if (lease_ms < 100 || lease_ms > 3600 * 1000) {
    return Fail(absl::InvalidArgumentError("--lease_ms: must be in [100, 3600000]"));
  }
  options.scheduler.lease = absl::Milliseconds(lease_ms);
  int64_t grace_ms = absl::GetFlag(FLAGS_startup_grace_ms);
  if (grace_ms < 0) return Fail(absl::InvalidArgumentError("--startup_grace_ms: must be >= 0"));
  options.scheduler.startup_grace = absl::Milliseconds(grace_ms);
  int64_t stop_ms = absl::GetFlag(FLAGS_task_stop_grace_ms);
  if (stop_ms < 0) return Fail(absl::InvalidArgumentError("--task_stop_grace_ms: must be >= 0"));
  options.scheduler.task_stop_grace = absl::Milliseconds(stop_ms);
  const int32_t max_recoveries = absl::GetFlag(FLAGS_max_recoveries);
  if (max_recoveries < 0) {
    return Fail(absl::InvalidArgumentError("--max_recoveries: must be >= 0"));
  }
  options.scheduler.max_recoveries = max_recoveries;
  const int64_t rebalance_ms = absl::GetFlag(FLAGS_rebalance_every_ms);
  if (rebalance_ms < 0) return Fail(absl::InvalidArgumentError("--rebalance_every_ms: must be >= 0"));
  options.scheduler.rebalance_every = absl::Milliseconds(rebalance_ms);
  const double imbalance = absl::GetFlag(FLAGS_rebalance_imbalance);
  if (!(imbalance >= 1.0)) {
    return Fail(absl::InvalidArgumentError("--rebalance_imbalance: must be >= 1"));
  }
  options.scheduler.rebalance.imbalance = imbalance;
  const double min_mb = absl::GetFlag(FLAGS_rebalance_min_mb_per_sec);
  if (!(min_mb >= 0)) {
    return Fail(absl::InvalidArgumentError("--rebalance_min_mb_per_sec: must be >= 0"));
  }
  options.scheduler.rebalance.min_bytes_per_sec = min_mb * 1e6;
  const double per_request = absl::GetFlag(FLAGS_rebalance_bytes_per_request);
  if (!(per_request >= 0 && per_request < 1e12)) {
    return Fail(absl::InvalidArgumentError("--rebalance_bytes_per_request: must be >= 0"));
  }
  options.scheduler.rebalance.bytes_per_request = per_request;
  const int64_t balance_ms = absl::GetFlag(FLAGS_data_balance_every_ms);
  if (balance_ms < 0) {
    return Fail(absl::InvalidArgumentError("--data_balance_every_ms: must be >= 0"));
  }
  options.scheduler.data_balance.every = absl::Milliseconds(balance_ms);
  const double tolerance = absl::GetFlag(FLAGS_data_balance_tolerance);
  if (!(tolerance >= 0 && tolerance < 10)) {
    return Fail(absl::InvalidArgumentError("--data_balance_tolerance: must be in [0, 10)"));
  }
  options.scheduler.data_balance.tolerance = tolerance;
  const int64_t copy_ms = absl::GetFlag(FLAGS_move_copy_timeout_ms);
  if (copy_ms < 100) return Fail(absl::InvalidArgumentError("--move_copy_timeout_ms: must be >= 100"));
  options.scheduler.move_copy_timeout = absl::Milliseconds(copy_ms);
  int64_t rpc_ms = absl::GetFlag(FLAGS_rpc_timeout_ms);
  if (rpc_ms < 10) return Fail(absl::InvalidArgumentError("--rpc_timeout_ms: must be >= 10"));
  options.rpc_timeout = absl::Milliseconds(rpc_ms);
  if (!absl::GetFlag(FLAGS_checkpoint_root).empty()) {
    auto root = pscluster::ResolveRoot(absl::GetFlag(FLAGS_checkpoint_root), "--checkpoint_root");
    if (!root.ok()) return Fail(root.status());
    options.scheduler.checkpoint_root = *root;
  }
  options.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key = absl::GetFlag(FLAGS_tls_key);
  options.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  options.token_file = absl::GetFlag(FLAGS_token_file);
  options.quota_file = absl::GetFlag(FLAGS_quota_file);
  options.audit_log = absl::GetFlag(FLAGS_audit_log);
  if (!absl::GetFlag(FLAGS_credential_file).empty()) {
    auto token = pscluster::ReadCredentialFile(absl::GetFlag(FLAGS_credential_file));
    if (!token.ok()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--credential_file: ", token.status().message())));
    }
    options.credential = *token;
  }

  const bool ha = !absl::GetFlag(FLAGS_etcd_endpoints).empty();
  // Given a value other than its default (absl 20220623 does not tell whether a flag was set).
  auto set = [](const char* name) {
    const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
    return f->CurrentValue() != f->DefaultValue();
  };
  for (const char* name : {"db", "db_sync"}) {
    if (ha && set(name)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--", name, ": the state is in etcd (--etcd_endpoints); leave --", name, " out")));
    }
  }
  for (const char* name : {"etcd_prefix", "etcd_lease_seconds", "advertise_address",
                           "etcd_ca_file", "etcd_cert_file", "etcd_key_file"}) {
    if (!ha && set(name)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--", name, ": only used with --etcd_endpoints")));
    }
  }
  pscluster::scheduler::HaOptions ha_options;
  ha_options.etcd_endpoints = absl::GetFlag(FLAGS_etcd_endpoints);
  ha_options.prefix = absl::GetFlag(FLAGS_etcd_prefix);
  ha_options.lease_seconds = absl::GetFlag(FLAGS_etcd_lease_seconds);
  ha_options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  ha_options.etcd_tls.ca = absl::GetFlag(FLAGS_etcd_ca_file);
  ha_options.etcd_tls.cert = absl::GetFlag(FLAGS_etcd_cert_file);
  ha_options.etcd_tls.key = absl::GetFlag(FLAGS_etcd_key_file);

  // Signals are taken by sigwait() below, not by whichever thread happens to run.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);  // Reads --token_file and --quota_file again.
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (ha) {
    auto replica = pscluster::scheduler::HaScheduler::Start(options, ha_options);
    if (!replica.ok()) return Fail(replica.status());
    int sig = 0;
    while (sigwait(&stop_signals, &sig) == 0 && sig == SIGHUP) {
      absl::Status reloaded = (*replica)->Reload();
      if (reloaded.ok()) {
        pscluster::Logger("scheduler")->info("SIGHUP: token and quota files reloaded");
      } else {
        pscluster::Logger("scheduler")->error(
            "SIGHUP: not reloaded, the previous files stay: {}", reloaded);
      }
    }
    pscluster::Logger("scheduler")->info("signal {}: shutting down", sig);
    (*replica)->Shutdown();
    return 0;
  }
  auto daemon = pscluster::scheduler::SchedulerDaemon::Start(options);
  if (!daemon.ok()) return Fail(daemon.status());

  int sig = 0;
  while (sigwait(&stop_signals, &sig) == 0 && sig == SIGHUP) {
    absl::Status reloaded = (*daemon)->ReloadTokenFile();
    if (reloaded.ok()) {
      pscluster::Logger("scheduler")->info("SIGHUP: token file reloaded");
    } else {
      pscluster::Logger("scheduler")->error(
          "SIGHUP: token file not reloaded, the previous one stays: {}", reloaded);
    }
    if (!options.quota_file.empty()) {
      reloaded = (*daemon)->ReloadQuotas();
      if (reloaded.ok()) {
        pscluster::Logger("scheduler")->info("SIGHUP: quota file reloaded");
      } else {
        pscluster::Logger("scheduler")->error(
            "SIGHUP: quota file not reloaded, the previous one stays: {}", reloaded);
      }
    }
  }
  pscluster::Logger("scheduler")->info("signal {}: shutting down", sig);
  (*daemon)->Shutdown();
  return 0;
}
