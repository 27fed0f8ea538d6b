// psctl: the command line to a pscluster scheduler. Flags are defined here only; they fill
// PsctlOptions (see commands.h for the commands).
#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/token_file.h"
#include "scheduler/psctl/commands.h"
#include "scheduler/psctl/up_command.h"

ABSL_FLAG(std::string, scheduler, "",
          "scheduler host:port, or several comma-separated (schedulers sharing etcd: the leader is "
          "used) (default: $PSCLUSTER_SCHEDULER, else 127.0.0.1:7070)");
ABSL_FLAG(std::string, o, "table", "output format: table, json or yaml");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "deadline of each call to the scheduler");
ABSL_FLAG(bool, wait, false, "submit: follow the job until it ends; exit 0 only on success");
ABSL_FLAG(bool, watch, false, "status JOB: live view until the job ends");
ABSL_FLAG(bool, history, false,
          "status JOB: the job's progress over time and its events (-o json: every point)");
ABSL_FLAG(std::string, to, "",
          "export JOB: the file to write (on the lead worker's machine; default: the job's "
          "export_path)");
ABSL_FLAG(int32_t, rank, -1, "logs: only this rank (default: every rank)");
ABSL_FLAG(bool, follow, false, "logs: print lines as they come until the job ends");
ABSL_FLAG(bool, active, false, "jobs: only queued, placing and running jobs");
ABSL_FLAG(std::string, reason, "", "cancel: why (recorded in the job)");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(1), "refresh period of live views");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle verifying the scheduler (enables TLS); default with --tls_cert and "
          "--tls_key unset: those of the secured local cluster (up --local --detach) whose "
          "scheduler is the one called");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "", "name the scheduler's certificate is checked for");
ABSL_FLAG(std::string, token_file, "",
          "file holding your bearer token, sent on every call to the scheduler (needs role "
          "admin to submit, cancel and move shards; viewer to read); default: "
          "$PSCLUSTER_TOKEN_FILE, else the token of the secured local cluster (up --local "
          "--detach) whose scheduler is the one called");
// up --local / down
ABSL_FLAG(bool, local, false, "up: run the cluster as local child processes on loopback");
ABSL_FLAG(bool, insecure, false,
          "up: start the local cluster without tokens or TLS (every daemon accepts every call "
          "from anyone who reaches its ports); default: secured with fresh tokens and mutual "
          "TLS under a throw-away CA, in WORK_DIR/credentials");
ABSL_FLAG(bool, detach, false, "up: leave the cluster running (stop it with psctl down)");
ABSL_FLAG(std::string, scheduler_bin, "", "up: ps_scheduler binary (default: next to psctl)");
ABSL_FLAG(std::string, server_bin, "", "up: ps_server binary (default: server/ps_server)");
ABSL_FLAG(std::string, worker_bin, "", "up: ps_worker binary (default: worker/ps_worker)");
ABSL_FLAG(std::string, job, "",
          "up: job file to run (default: deploy/examples/fashion_mlp.yaml; none = no job)");
ABSL_FLAG(std::string, work_dir, "",
          "up/down: logs, ports, database and outputs (default: $TMPDIR/pscluster-local-UID)");
ABSL_FLAG(int32_t, servers, 2,
          "up: parameter servers to start; scale JOB: how many servers the job should have");
ABSL_FLAG(int32_t, workers, 2, "up: workers to start");
ABSL_FLAG(std::string, device, "cpu", "up: --device of the workers (auto, cuda or cpu)");
ABSL_FLAG(std::string, log_level, "info", "up: --log_level of the daemons");
ABSL_FLAG(absl::Duration, startup_timeout, absl::Seconds(60),
          "up: how long each daemon may take to start");
ABSL_FLAG(std::string, server_args, "", "up: extra flags for each server, space-separated");
ABSL_FLAG(std::string, worker_args, "", "up: extra flags for each worker, space-separated");

namespace {

std::string SelfPath(const char* argv0) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    buf[n] = 0;
    return buf;
  }
  return argv0;
}

std::vector<std::string> Words(const std::string& s) {
  return absl::StrSplit(s, ' ', absl::SkipWhitespace());
}

}  // namespace

int main(int argc, char** argv) {
  // The same text as a usage error prints: every command, move-shard included.
  absl::SetProgramUsageMessage(pscluster::psctl::UsageText());
  // SIGINT/SIGTERM go to the signal thread below, whatever thread is running.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  pscluster::psctl::Interrupt interrupt;
  std::thread([&interrupt, stop_signals] {
    while (true) {
      int sig = 0;
      if (sigwait(&stop_signals, &sig) != 0) continue;
      if (!interrupt.handled.load()) {
        std::cerr << std::endl;
        _exit(130);
      }
      if (interrupt.requested.exchange(true)) {
        std::cerr << "psctl: still stopping the child processes..." << std::endl;
      }
    }
  }).detach();

  pscluster::psctl::PsctlOptions o;
  std::string address = absl::GetFlag(FLAGS_scheduler);
  if (address.empty()) {
    const char* env = std::getenv("PSCLUSTER_SCHEDULER");
    address = env != nullptr && *env ? env : "127.0.0.1:7070";
  }
  o.client.address = address;
  o.client.timeout = absl::GetFlag(FLAGS_timeout);
  if (o.client.timeout <= absl::ZeroDuration()) {
    std::cerr << "psctl: --timeout must be > 0" << std::endl;
    return 2;
  }
  o.client.channel.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  o.client.channel.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  o.client.channel.tls.key = absl::GetFlag(FLAGS_tls_key);
  o.client.channel.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  // The token: --token_file, else $PSCLUSTER_TOKEN_FILE, else (commands other than up and
  // down) that of the secured local cluster this scheduler belongs to.
  std::vector<std::string> args(positional.begin() + 1, positional.end());
  std::string token_file = absl::GetFlag(FLAGS_token_file);
  std::string token_source = "--token_file";
  if (token_file.empty()) {
    const char* env = std::getenv("PSCLUSTER_TOKEN_FILE");
    if (env != nullptr && *env) {
      token_file = env;
      token_source = "$PSCLUSTER_TOKEN_FILE";
    }
  }
  const bool launcher = !args.empty() && (args[0] == "up" || args[0] == "down");
  if (!launcher) {
    // The detached local cluster at this address: its token unless one was given, and its
    // certificates unless psctl was given --tls_* flags.
    const std::string work_dir = absl::GetFlag(FLAGS_work_dir);
    auto local = pscluster::psctl::StateFileCredentials(
        work_dir.empty() ? pscluster::psctl::DefaultWorkDir() : work_dir, address);
    if (token_file.empty() && !local.token_file.empty()) {
      token_file = local.token_file;
      token_source = "the local cluster's token";
    }
    if (!o.client.channel.tls.enabled()) o.client.channel.tls = local.tls;
  }
  if (!token_file.empty()) {
    auto token = pscluster::ReadCredentialFile(token_file);
    if (!token.ok()) {
      std::cerr << "psctl: " << token_source << ": " << token.status().message() << std::endl;
      return 2;
    }
    o.client.channel.bearer_token = *token;
  }
  auto format = pscluster::psctl::ParseOutputFormat(absl::GetFlag(FLAGS_o));
  if (!format.ok()) {
    std::cerr << "psctl: " << format.status().message() << std::endl;
    return 2;
  }
  o.output = *format;
  o.wait = absl::GetFlag(FLAGS_wait);
  o.watch = absl::GetFlag(FLAGS_watch);
  o.history = absl::GetFlag(FLAGS_history);
  o.active_only = absl::GetFlag(FLAGS_active);
  o.reason = absl::GetFlag(FLAGS_reason);
  o.export_to = absl::GetFlag(FLAGS_to);
  o.logs_rank = absl::GetFlag(FLAGS_rank);
  o.follow = absl::GetFlag(FLAGS_follow);
  o.interval = std::max(absl::GetFlag(FLAGS_interval), absl::Milliseconds(50));
  o.tty = isatty(STDOUT_FILENO) != 0;
  o.self_path = SelfPath(argv[0]);
  o.interrupt = &interrupt;
  o.up.local = absl::GetFlag(FLAGS_local);
  o.up.detach = absl::GetFlag(FLAGS_detach);
  o.up.insecure = absl::GetFlag(FLAGS_insecure);
  o.up.scheduler_bin = absl::GetFlag(FLAGS_scheduler_bin);
  o.up.server_bin = absl::GetFlag(FLAGS_server_bin);
  o.up.worker_bin = absl::GetFlag(FLAGS_worker_bin);
  o.up.job_file = absl::GetFlag(FLAGS_job);
  o.up.work_dir = absl::GetFlag(FLAGS_work_dir);
  o.up.servers = absl::GetFlag(FLAGS_servers);
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") break;
    if (absl::StartsWith(a, "--servers") || absl::StartsWith(a, "-servers")) {
      o.scale_servers = absl::GetFlag(FLAGS_servers);
    }
  }
  o.up.workers = absl::GetFlag(FLAGS_workers);
  o.up.device = absl::GetFlag(FLAGS_device);
  o.up.log_level = absl::GetFlag(FLAGS_log_level);
  o.up.startup_timeout = absl::GetFlag(FLAGS_startup_timeout);
  o.up.server_args = Words(absl::GetFlag(FLAGS_server_args));
  o.up.worker_args = Words(absl::GetFlag(FLAGS_worker_args));

  return pscluster::psctl::RunPsctl(o, args, std::cout, std::cerr);
}
