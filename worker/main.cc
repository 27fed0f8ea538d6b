// ps_worker: the pscluster training worker. Flags are defined here only; they fill
// WorkerDaemonOptions (worker_daemon.h) and TrainerOptions.
//
// With --scheduler, the worker registers, heartbeats and trains the tasks the scheduler assigns,
// until SIGINT/SIGTERM (SIGHUP reads --token_file again). Without it (standalone), it trains one
// job given as --job=FILE.yaml against --servers=HOST:PORT,... as rank --rank of --num_workers,
// prints the result and exits.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/path_root.h"
#include "common/token_file.h"
#include "scheduler/job_yaml.h"
#include "server/tls_stream.h"
#include "worker/standalone.h"
#include "worker/trainer.h"
#include "worker/worker_daemon.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve WorkerControl on (port 0 = any)");
ABSL_FLAG(std::string, advertise_host, "",
          "host the scheduler should call this worker at (default: the --listen host; "
          "127.0.0.1 when listening on all interfaces)");
ABSL_FLAG(std::string, port_file, "", "write the real host:port here once serving");
ABSL_FLAG(std::string, scheduler, "", "host:port of ps_scheduler (several, comma-separated, or dns:///NAME:PORT: schedulers sharing "
          "etcd, the leader is followed; empty = standalone, see --job)");
ABSL_FLAG(std::string, device, "auto",
          "compute backend when a job leaves it open: auto (CUDA if a device is usable, else "
          "CPU), cuda, cuda:N or cpu");
ABSL_FLAG(int, cpu_threads, 0, "threads of the CPU backend (0 = all cores)");
ABSL_FLAG(int, cpu_slots, 1, "CPU training tasks offered to the scheduler");
ABSL_FLAG(uint64_t, memory_bytes, 0, "memory offered to the scheduler (0 = physical memory)");
ABSL_FLAG(std::string, fashion_mnist_dir, "",
          "Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)");
ABSL_FLAG(std::string, spam_assassin_dir, "",
          "SpamAssassin corpus (default /usr/local/share/pscluster/spam-assassin/data)");
ABSL_FLAG(int, call_timeout_sec, 120,
          "deadline of each pull/push, waiting for slower workers included");
ABSL_FLAG(std::string, data_transport, "auto",
          "data plane to the servers: auto (a server's Unix data socket when it runs on this "
          "host, else its TCP data port, in TLS with --tls_*; else gRPC), grpc, tcp or unix");
ABSL_FLAG(int, data_spin_us, 50,
          "TCP data plane: a thread waiting for a server's reply checks the socket this long "
          "before it sleeps (0 = never)");
ABSL_FLAG(bool, tls_vector_aes, true,
          "TLS data plane: seal and open AES-GCM records with this CPU's vector AES and "
          "carry-less multiply instructions (VAES, VPCLMULQDQ; on AVX-512 or AVX2) where it "
          "has them, 2-4x OpenSSL 3.0's rate; false: OpenSSL does every record (e.g. where only a "
          "validated OpenSSL module may do the crypto)");
ABSL_FLAG(int, data_shm_mib, 16,
          "Unix data socket: offer the server shared memory with two rings of this many MiB "
          "(requests, replies) so that payloads bypass the socket (0 = never)");
ABSL_FLAG(int, register_timeout_sec, 60,
          "give up registering with --scheduler after this long (exit 138, retryable)");
ABSL_FLAG(std::string, export_root, "",
          "directory every model export must be written in (the job's export_path, psctl "
          "export --to; others are refused); empty = anywhere");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port serving Prometheus text at /metrics (empty = no metrics endpoint)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical or off");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of this worker (TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle verifying peers (mutual TLS)");
ABSL_FLAG(std::string, token_file, "",
          "identities and roles allowed to call this worker: lines 'SHA256_HEX_OF_TOKEN|- "
          "IDENTITY ROLE[,ROLE...]' (re-read on SIGHUP); empty = no authentication (a warning "
          "is logged)");
ABSL_FLAG(std::string, audit_log, "",
          "append a JSON line per call that changes state (AssignTask, StopTask, "
          "UpdatePartition, ExportModel, ...) and per refused call to this file; empty = none");
ABSL_FLAG(std::string, credential_file, "",
          "file holding the token this worker sends to the scheduler and the servers (its "
          "identity needs roles node and worker)");
ABSL_FLAG(bool, allow_entrypoints, false,
          "run jobs' own commands (the job's entrypoint) as child processes of this worker, as "
          "its user; off: the scheduler places no entrypoint job here");
ABSL_FLAG(int, entrypoint_grace_sec, 10,
          "a stopped entrypoint task's process group gets SIGTERM, then SIGKILL after this long");
// Standalone mode.
ABSL_FLAG(std::string, job, "", "standalone: job YAML file to train");
ABSL_FLAG(std::string, servers, "", "standalone: comma-separated host:port of ps_server daemons");
ABSL_FLAG(int, rank, 0, "standalone: this worker's rank");
ABSL_FLAG(int, num_workers, 0, "standalone: workers in the job (default: the job's num_workers)");

namespace {

constexpr int kExitRetryable = 138;

int Fail(const absl::Status& s, int code = 1) {
  std::fprintf(stderr, "ps_worker: %s\n", s.ToString().c_str());
  return code;
}

// Logs progress in standalone runs.
class LogSink final : public pscluster::worker::ProgressSink {
 public:
  bool Report(const pscluster::v1::WorkerProgress& p) override {
    pscluster::Logger("worker")->info(
        "rank {} step {}/{} epoch {} loss {:.4f} train acc {:.4f} test acc {:.4f} {:.0f} samples/s",
        p.rank(), p.step(), p.total_steps(), p.epoch(), p.loss(), p.train_accuracy(),
        p.test_accuracy(), p.samples_per_sec());
    return true;
  }
  absl::StatusOr<pscluster::v1::ShardMap> RefreshShardMap() override {
    return absl::UnavailableError("standalone worker: the shard map is fixed");
  }
};

int RunStandalone(const pscluster::worker::TrainerOptions& base) {
  using namespace pscluster;
  std::string job_file = absl::GetFlag(FLAGS_job);
  if (job_file.empty()) {
    return Fail(absl::InvalidArgumentError(
        "give --scheduler=HOST:PORT, or --job=FILE.yaml with --servers for a standalone run"), 2);
  }
  auto text = ReadFile(job_file);
  if (!text.ok()) return Fail(text.status(), 2);
  auto spec = scheduler::LoadJobYaml(*text, job_file);
  if (!spec.ok()) return Fail(spec.status(), 2);
  std::vector<std::string> servers =
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  v1::AssignTaskRequest task;
  task.set_job_id(absl::StrCat("standalone-", spec->name()));
  *task.mutable_spec() = *spec;
  int workers = absl::GetFlag(FLAGS_num_workers);
  task.set_num_workers(workers > 0 ? workers : std::max<uint32_t>(1, spec->num_workers()));
  int rank = absl::GetFlag(FLAGS_rank);
  if (rank < 0 || static_cast<uint32_t>(rank) >= task.num_workers()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--rank: ", rank, " is not below the number of workers ", task.num_workers())), 2);
  }
  task.set_rank(rank);
  auto map = worker::RoundRobinShardMap(task.job_id(), servers, spec->num_virtual_shards());
  if (!map.ok()) return Fail(map.status(), 2);
  *task.mutable_shard_map() = *map;
  worker::TrainerOptions opts = base;
  opts.install_shard_map = true;
  LogSink sink;
  auto trainer = worker::Trainer::Create(task, opts, &sink);
  if (!trainer.ok()) return Fail(trainer.status(), 2);
  absl::Status s = (*trainer)->Run();
  if (!s.ok()) return Fail(s);
  worker::TrainerResult r = (*trainer)->result();
  std::printf("steps %lld  test accuracy %.4f  test loss %.4f  %.0f samples/s  device %s%s%s\n",
              static_cast<long long>(r.steps), r.test_accuracy, r.test_loss, r.samples_per_sec,
              r.device.c_str(), r.export_path.empty() ? "" : "  exported ",
              r.export_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace pscluster;
  absl::SetProgramUsageMessage(
      "ps_worker --scheduler=HOST:PORT [--listen=HOST:PORT] [--device=auto|cuda|cpu]\n"
      "   or: ps_worker --job=FILE.yaml --servers=HOST:PORT,... [--rank=R --num_workers=N]\n"
      "The pscluster training worker.");
  absl::ParseCommandLine(argc, argv);
  pscluster::DisableMutexDeadlockDetection();
  absl::Status s = SetLogLevel(absl::GetFlag(FLAGS_log_level));
  if (!s.ok()) return Fail(s, 2);
  auto log = Logger("worker");

  worker::TrainerOptions topts;
  topts.device = absl::GetFlag(FLAGS_device);
  topts.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  topts.data_dirs.fashion_mnist = absl::GetFlag(FLAGS_fashion_mnist_dir);
  topts.data_dirs.spam_assassin = absl::GetFlag(FLAGS_spam_assassin_dir);
  topts.channel.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  topts.channel.tls.key = absl::GetFlag(FLAGS_tls_key);
  topts.channel.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  if (!absl::GetFlag(FLAGS_credential_file).empty()) {
    auto token = ReadCredentialFile(absl::GetFlag(FLAGS_credential_file));
    if (!token.ok()) {
      return Fail(absl::InvalidArgumentError(
                      absl::StrCat("--credential_file: ", token.status().message())),
                  2);
    }
    topts.channel.bearer_token = *token;
  }
  topts.call_timeout = absl::Seconds(absl::GetFlag(FLAGS_call_timeout_sec));
  if (!absl::GetFlag(FLAGS_export_root).empty()) {
    auto root = ResolveRoot(absl::GetFlag(FLAGS_export_root), "--export_root");
    if (!root.ok()) return Fail(root.status(), 2);
    topts.export_root = *root;
  }
  if (topts.cpu_threads < 0) return Fail(absl::InvalidArgumentError("--cpu_threads: must be >= 0"), 2);
  if (absl::GetFlag(FLAGS_call_timeout_sec) <= 0) {
    return Fail(absl::InvalidArgumentError("--call_timeout_sec: must be > 0"), 2);
  }
  auto transport = pscluster::ParseDataTransport(absl::GetFlag(FLAGS_data_transport));
  if (!transport.ok()) {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("--data_transport: ", transport.status().message())),
                2);
  }
  topts.data_transport = *transport;
  if (absl::GetFlag(FLAGS_data_spin_us) < 0 || absl::GetFlag(FLAGS_data_spin_us) > 100000) {
    return Fail(absl::InvalidArgumentError("--data_spin_us: must be in [0, 100000]"), 2);
  }
  topts.data_spin = absl::Microseconds(absl::GetFlag(FLAGS_data_spin_us));
  pscluster::TlsIo::SetVectorAes(absl::GetFlag(FLAGS_tls_vector_aes));
  if (absl::GetFlag(FLAGS_data_shm_mib) < 0 || absl::GetFlag(FLAGS_data_shm_mib) > 4096) {
    return Fail(absl::InvalidArgumentError("--data_shm_mib: must be in [0, 4096]"), 2);
  }
  topts.data_shm_ring_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_data_shm_mib)) << 20;
  const std::string device = topts.device;
  if (device != "auto" && device != "cpu" && device.rfind("cuda", 0) != 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--device: '", device, "' must be auto, cuda, cuda:N or cpu")), 2);
  }

  if (absl::GetFlag(FLAGS_scheduler).empty()) return RunStandalone(topts);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);  // Reads --token_file again.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  worker::WorkerDaemonOptions dopts;
  dopts.scheduler_address = absl::GetFlag(FLAGS_scheduler);
  dopts.listen_address = absl::GetFlag(FLAGS_listen);
  dopts.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  dopts.port_file = absl::GetFlag(FLAGS_port_file);
  dopts.metrics_address = absl::GetFlag(FLAGS_metrics_listen);
  dopts.token_file = absl::GetFlag(FLAGS_token_file);
  dopts.audit_log = absl::GetFlag(FLAGS_audit_log);
  dopts.cpu_slots = absl::GetFlag(FLAGS_cpu_slots);
  dopts.memory_bytes = absl::GetFlag(FLAGS_memory_bytes);
  dopts.registration_timeout = absl::Seconds(absl::GetFlag(FLAGS_register_timeout_sec));
  dopts.trainer = topts;
  dopts.entrypoint.allow = absl::GetFlag(FLAGS_allow_entrypoints);
  if (absl::GetFlag(FLAGS_entrypoint_grace_sec) < 0 ||
      absl::GetFlag(FLAGS_entrypoint_grace_sec) > 3600) {
    return Fail(absl::InvalidArgumentError("--entrypoint_grace_sec: must be in [0, 3600]"), 2);
  }
  dopts.entrypoint.stop_grace = absl::Seconds(absl::GetFlag(FLAGS_entrypoint_grace_sec));
  dopts.entrypoint.tls_ca = topts.channel.tls.ca;
  dopts.entrypoint.tls_cert = topts.channel.tls.cert;
  dopts.entrypoint.tls_key = topts.channel.tls.key;
  dopts.entrypoint.credential_file = absl::GetFlag(FLAGS_credential_file);
  std::atomic<int> exit_code{0};
  dopts.on_fatal = [&exit_code](absl::Status why) {
    exit_code.store(kExitRetryable);
    Logger("worker")->error("exiting: {}", why);
    kill(getpid(), SIGTERM);
  };
  auto daemon = worker::WorkerDaemon::Start(std::move(dopts));
  if (!daemon.ok()) return Fail(daemon.status(), 2);

  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    absl::Status reloaded = (*daemon)->ReloadTokenFile();
    if (reloaded.ok()) {
      log->info("SIGHUP: token file reloaded");
    } else {
      log->error("SIGHUP: token file not reloaded, the previous one stays: {}", reloaded);
    }
  }
  if (exit_code.load() == 0) log->info("signal {}: shutting down", sig);
  (*daemon)->Shutdown();
  return exit_code.load();
}
