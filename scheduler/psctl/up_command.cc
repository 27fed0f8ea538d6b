#include "scheduler/psctl/up_command.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/atomic_file.h"
#include "scheduler/job_yaml.h"
#include "scheduler/psctl/follow.h"
#include "scheduler/psctl/local_cluster.h"
#include "scheduler/psctl/local_credentials.h"

namespace pscluster::psctl {
namespace {

int Fail(std::ostream& err, const absl::Status& s) {
  err << "psctl: " << s.message() << std::endl;
  return 1;
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string StatePath(const std::string& work_dir) { return work_dir + "/cluster.state"; }

// Whether a state file lists a process that still runs.
bool StateFileIsLive(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return false;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 3));
    int pid = 0;
    if (f.size() == 4 && f[0] == "process" && absl::SimpleAtoi(f[2], &pid) && pid > 1 &&
        PidRuns(pid, f[3])) {
      return true;
    }
  }
  return false;
}

}  // namespace

StateFileAccess StateFileCredentials(const std::string& work_dir,
                                     const std::string& scheduler_address) {
  auto text = ReadFile(StatePath(work_dir));
  if (!text.ok()) return {};
  std::string address;
  StateFileAccess a;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 1));
    if (f.size() != 2) continue;
    if (f[0] == "scheduler") address = f[1];
    if (f[0] == "credential") a.token_file = f[1];
    if (f[0] == "tls_ca") a.tls.ca = f[1];
    if (f[0] == "tls_cert") a.tls.cert = f[1];
    if (f[0] == "tls_key") a.tls.key = f[1];
  }
  return address == scheduler_address ? a : StateFileAccess{};
}

std::string DefaultWorkDir() {
  const char* tmp = std::getenv("TMPDIR");
  return absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/pscluster-local-", getuid());
}

absl::StatusOr<std::string> FindBinary(const std::string& flag_value, const std::string& self,
                                       const std::string& package, const std::string& name,
                                       const std::string& flag) {
  if (!flag_value.empty()) {
    if (access(flag_value.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(flag, ": the ", name, " binary '", flag_value,
                                              "' does not exist or is not executable"));
    }
    return flag_value;
  }
  std::vector<std::string> tried = CandidatePaths(self, package, name);
  for (const std::string& p : tried) {
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return absl::NotFoundError(absl::StrCat(
      "cannot find the ", name, " binary (looked at ", absl::StrJoin(tried, ", "),
      "); build it with `bazel build //", package, ":", name, "` or pass ", flag, "=PATH"));
}

int RunUp(const PsctlOptions& o, std::ostream& out, std::ostream& err) {
  const UpOptions& u = o.up;
  auto sched_bin = FindBinary(u.scheduler_bin, o.self_path, "scheduler", "ps_scheduler",
                              "--scheduler_bin");
  if (!sched_bin.ok()) return Fail(err, sched_bin.status());
  auto server_bin = FindBinary(u.server_bin, o.self_path, "server", "ps_server", "--server_bin");
  if (!server_bin.ok()) return Fail(err, server_bin.status());
  auto worker_bin = FindBinary(u.worker_bin, o.self_path, "worker", "ps_worker", "--worker_bin");
  if (!worker_bin.ok()) return Fail(err, worker_bin.status());

  // The job is read and checked before anything starts.
  std::string job_file = u.job_file;
  std::optional<v1::JobSpec> spec;
  if (job_file != "none") {
    if (job_file.empty()) {
      for (const std::string& p : CandidatePaths(o.self_path, "deploy/examples", "fashion_mlp.yaml")) {
        if (Exists(p)) {
          job_file = p;
          break;
        }
      }
      if (job_file.empty()) {
        return Fail(err, absl::NotFoundError(
                             "cannot find deploy/examples/fashion_mlp.yaml; pass --job=FILE"));
      }
    }
    auto text = ReadFile(job_file);
    if (!text.ok()) return Fail(err, text.status());
    auto parsed = scheduler::LoadJobYaml(*text, job_file);
    if (!parsed.ok()) return Fail(err, parsed.status());
    spec = *parsed;
    if (static_cast<int>(spec->num_servers()) > u.servers ||
        static_cast<int>(spec->num_workers()) > u.workers) {
      return Fail(err, absl::InvalidArgumentError(absl::StrCat(
                           job_file, ": the job asks for ", spec->num_servers(), " servers and ",
                           spec->num_workers(), " workers; start the local cluster with --servers=",
                           spec->num_servers(), " --workers=", spec->num_workers())));
    }
  }

  std::string work_dir = u.work_dir.empty() ? DefaultWorkDir() : u.work_dir;
  std::string state = StatePath(work_dir);
  if (Exists(state)) {
    if (StateFileIsLive(state)) {
      return Fail(err, absl::FailedPreconditionError(absl::StrCat(
                           "a local cluster started earlier is still running (", state,
                           "); stop it with psctl down", u.work_dir.empty() ? "" : " --work_dir=",
                           u.work_dir)));
    }
    std::remove(state.c_str());
  }
  if (spec.has_value()) {
    // Outputs of a local run stay in its work directory.
    absl::Status s = MakeDirs(work_dir + "/models");
    if (!s.ok()) return Fail(err, s);
    // A graph model is not exported (refused at submission): it trains and is evaluated only.
    if (spec->model().kind() != "graph") {
      spec->set_export_path(absl::StrCat(work_dir, "/models/", spec->name(), ".safetensors"));
    }
    if (!spec->checkpoint_dir().empty()) {
      spec->set_checkpoint_dir(absl::StrCat(work_dir, "/checkpoints/", spec->name()));
    }
  }

  if (o.interrupt != nullptr) o.interrupt->handled = true;
  auto interrupted = [&o] { return o.interrupt != nullptr && o.interrupt->requested.load(); };
  LocalClusterOptions lo;
  lo.scheduler_bin = *sched_bin;
  lo.server_bin = *server_bin;
  lo.worker_bin = *worker_bin;
  lo.num_servers = u.servers;
  lo.num_workers = u.workers;
  lo.work_dir = work_dir;
  lo.log_level = u.log_level;
  lo.device = u.device;
  lo.startup_timeout = u.startup_timeout;
  lo.detach = u.detach;
  lo.server_args = u.server_args;
  lo.worker_args = u.worker_args;
  lo.interrupted = interrupted;
  ClientOptions co = o.client;
  if (co.channel.tls.enabled() || !co.channel.tls_server_name.empty()) {
    return Fail(err, absl::InvalidArgumentError(
                         "--tls_ca, --tls_cert, --tls_key and --tls_server_name are for a cluster "
                         "that is already running: psctl up --local makes its own CA and "
                         "certificates (or none with --insecure)"));
  }
  out << "starting a local cluster in " << work_dir << std::endl;
  if (!u.insecure) {
    // Fresh tokens: only this user (the files are 0600) can call the cluster. A token psctl
    // was given (--token_file) is admitted as an admin too, and this command sends it.
    auto creds = MakeLocalCredentials(work_dir, o.client.channel.bearer_token);
    if (!creds.ok()) {
      return Fail(err, absl::Status(creds.status().code(),
                                    absl::StrCat("cannot make the cluster's tokens: ",
                                                 creds.status().message())));
    }
    auto with = [](std::vector<std::string> first, const std::vector<std::string>& then) {
      first.insert(first.end(), then.begin(), then.end());  // The user's flags come last and win.
      return first;
    };
    lo.scheduler_args = creds->scheduler_args;
    lo.server_args = with(creds->server_args, u.server_args);
    lo.worker_args = with(creds->worker_args, u.worker_args);
    if (co.channel.bearer_token.empty()) co.channel.bearer_token = creds->admin_token;
    co.channel.tls = creds->admin_tls;
    lo.token = co.channel.bearer_token;
    lo.credential_file = creds->admin_token_file;
    lo.tls = creds->admin_tls;
    out << "secured: every daemon serves mutual TLS under a throw-away CA and authenticates its "
           "callers with the tokens and certificates in "
        << creds->dir << " (readable by you only; psctl's token is " << creds->admin_token_file
        << "); --insecure starts an open cluster" << std::endl;
  } else {
    out << "insecure: every daemon accepts every call from anyone who reaches its ports on this "
           "machine (--insecure)"
        << std::endl;
  }
  auto cluster = LocalCluster::Start(lo, out);
  if (!cluster.ok()) {
    if (cluster.status().code() == absl::StatusCode::kCancelled) {
      err << "psctl: interrupted; every process started was stopped" << std::endl;
      return 130;
    }
    return Fail(err, cluster.status());
  }
  LocalCluster& c = **cluster;
  if (u.detach) {
    absl::Status s = c.WriteStateFile(state);
    if (!s.ok()) return Fail(err, s);
  }

  co.address = c.scheduler_address();
  auto client = SchedulerClient::Connect(co);
  if (!client.ok()) return Fail(err, client.status());
  std::string job_id;
  if (spec.has_value()) {
    v1::SubmitJobRequest req;
    *req.mutable_job() = *spec;
    req.set_source(job_file);
    absl::BitGen gen;
    req.set_client_token(absl::StrFormat("up-%016x", absl::Uniform<uint64_t>(gen)));
    auto resp = (*client)->SubmitJob(req);
    if (!resp.ok()) return Fail(err, resp.status());
    job_id = resp->job_id();
    out << "submitted " << job_id << " (" << spec->name() << ") from " << job_file
        << (spec->export_path().empty() ? "; the model is not exported"
                                        : "; the model will be exported to " + spec->export_path())
        << std::endl;
  }
  if (u.detach) {
    c.Release();
    out << "the cluster keeps running; use it with:\n  export PSCLUSTER_SCHEDULER="
        << c.scheduler_address() << "\n";
    if (!u.insecure) {
      // psctl also finds it by itself in the state file (for this scheduler address).
      out << "  export PSCLUSTER_TOKEN_FILE=" << LocalAdminTokenFile(work_dir) << "\n";
      out << "  (other clients: --tls_ca=" << lo.tls.ca << " --tls_cert=" << lo.tls.cert
          << " --tls_key=" << lo.tls.key << ")\n";
    }
    if (!job_id.empty()) out << "  psctl status " << job_id << " --watch\n";
    out << "  psctl down" << (u.work_dir.empty() ? "" : " --work_dir=" + u.work_dir)
        << "    # stops it" << std::endl;
    return 0;
  }

  auto stop = [&](const char* why) {
    int n = c.Stop();
    out << why << ": stopped " << n << " process" << (n == 1 ? "" : "es") << " (logs in "
        << work_dir << "/logs)" << std::endl;
  };
  if (job_id.empty()) {
    out << "the cluster runs until Ctrl-C (scheduler at " << c.scheduler_address()
        << (lo.credential_file.empty()
                ? ""
                : absl::StrCat("; psctl --scheduler=", c.scheduler_address(), " --token_file=",
                               lo.credential_file, " --tls_ca=", lo.tls.ca, " --tls_cert=",
                               lo.tls.cert, " --tls_key=", lo.tls.key))
        << ")" << std::endl;
    while (!interrupted()) {
      absl::Status alive = c.CheckAlive();
      if (!alive.ok()) {
        Fail(err, alive);
        stop("a process died");
        return 1;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    stop("interrupted");
    return 130;
  }
  FollowOptions f;
  f.check = [&c] { return c.CheckAlive(); };
  auto job = FollowJob(**client, job_id, o, f, out);
  if (!job.ok()) {
    bool ctrl_c = job.status().code() == absl::StatusCode::kCancelled;
    if (ctrl_c) {
      out << "interrupted: cancelling " << job_id << " and stopping the local cluster"
          << std::endl;
    } else {
      Fail(err, job.status());
    }
    ClientOptions quick = co;
    quick.timeout = absl::Seconds(2);
    if (auto q = SchedulerClient::Connect(quick); q.ok()) {
      (void)(*q)->CancelJob(job_id, ctrl_c ? "interrupted (Ctrl-C on psctl up)" :
                                             "the local cluster failed");
    }
    stop(ctrl_c ? "interrupted" : "failed");
    return ctrl_c ? 130 : 1;
  }
  out << FinalSummary(*job) << std::endl;
  stop("done");
  return job->state() == v1::JOB_SUCCEEDED ? 0 : 1;
}

int RunDown(const PsctlOptions& o, std::ostream& out, std::ostream& err) {
  std::string work_dir = o.up.work_dir.empty() ? DefaultWorkDir() : o.up.work_dir;
  std::string state = StatePath(work_dir);
  auto n = LocalCluster::StopFromStateFile(state, absl::Seconds(5), out);
  if (!n.ok()) {
    if (n.status().code() == absl::StatusCode::kNotFound) {
      out << "no local cluster is running (no " << state << ")" << std::endl;
      return 0;
    }
    return Fail(err, n.status());
  }
  out << "local cluster stopped (" << *n << " processes)" << std::endl;
  return 0;
}

}  // namespace pscluster::psctl
