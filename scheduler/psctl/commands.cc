#include "scheduler/psctl/commands.h"

#include <cstdlib>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "scheduler/job_state.h"
#include "scheduler/psctl/follow.h"
#include "scheduler/psctl/logs_command.h"
#include "scheduler/psctl/up_command.h"

namespace pscluster::psctl {
namespace {

constexpr char kUsage[] =
    "usage: psctl [--scheduler=HOST:PORT] [-o table|json|yaml] [--timeout=10s] COMMAND\n"
    "  submit FILE.yaml [--wait]   queue a job (prints its id); --wait follows it to the end\n"
    "  jobs [--active]             list jobs, newest first\n"
    "  status [JOB] [--watch]      a job in full (live with --watch), or the whole cluster\n"
    "  status JOB --history        the job's progress over time and its events (recoveries,\n"
    "                              shard moves, data balance)\n"
    "  cancel JOB [--reason=TEXT]  stop a job\n"
    "  nodes                       servers and workers, liveness and load\n"
    "  shards JOB                  a job's shard map and per-shard load\n"
    "  move-shard JOB SHARD SERVER [FROM]\n"
    "                              move a virtual shard of a running job to another server\n"
    "                              while it trains, and follow the move to its end (FROM: the\n"
    "                              server whose backup of it moves; default its primary)\n"
    "  scale JOB --servers N       grow or shrink a running job's servers to N while it trains\n"
    "                              (live shard moves), and follow the change to its end\n"
    "  drain SERVER                move every job's shards off a server, then mark it drained\n"
    "                              (no new work; safe to stop); follows it to its end\n"
    "  undrain SERVER              put a draining or drained server back into service\n"
    "  checkpoint JOB [DIR]        checkpoint a running job now (into DIR, default the job's\n"
    "                              checkpoint_dir): one file per server\n"
    "  export JOB [--to PATH]      export a running job's model now (safetensors, written by\n"
    "                              its lead worker; default PATH: the job's export_path)\n"
    "  logs JOB [--rank N] [--follow]  the output (stdout, stderr) of an entrypoint job's\n"
    "                              tasks; --follow: as it comes, until the job ends\n"
    "  up --local [--detach]       run a local cluster (scheduler, 2 servers, 2 workers) and\n"
    "                              the example job on it; secured with fresh tokens in\n"
    "                              WORK_DIR/credentials (--insecure: without)\n"
    "  down                        stop a cluster started with up --local --detach\n"
    "The scheduler address comes from --scheduler, else $PSCLUSTER_SCHEDULER, else "
    "127.0.0.1:7070;\nthe token from --token_file, else $PSCLUSTER_TOKEN_FILE, else that of the "
    "secured local\ncluster (--work_dir) whose scheduler is called.\n";

}  // namespace

const char* UsageText() { return kUsage; }

namespace {

int Fail(std::ostream& err, const absl::Status& s) {
  err << "psctl: " << s.message() << std::endl;
  return 1;
}

int Usage(std::ostream& err, const std::string& problem) {
  err << "psctl: " << problem << "\n" << kUsage;
  return 2;
}

void Print(const PsctlOptions& o, const google::protobuf::Message& msg, std::ostream& out) {
  out << (o.output == OutputFormat::kYaml ? ToYaml(msg) : ToJson(msg));
  if (o.output == OutputFormat::kJson) out << "\n";
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

std::string NewToken() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

int ExitFor(const v1::Job& job) { return job.state() == v1::JOB_SUCCEEDED ? 0 : 1; }

int Submit(const PsctlOptions& o, SchedulerClient& client, const std::string& file,
           std::ostream& out, std::ostream& err) {
  auto text = ReadFile(file);
  if (!text.ok()) return Fail(err, text.status());
  v1::SubmitJobRequest req;
  req.set_yaml(*text);
  req.set_source(file);
  req.set_client_token(NewToken());
  auto resp = client.SubmitJob(req);
  if (!resp.ok()) return Fail(err, resp.status());
  bool table = o.output == OutputFormat::kTable;
  if (table) {
    out << resp->job_id() << std::endl;
  } else if (!o.wait) {
    Print(o, *resp, out);
  }
  if (!o.wait) return 0;
  if (o.interrupt) o.interrupt->handled = true;
  // Live lines go to stderr when stdout carries JSON or YAML.
  std::ostream& live = table ? out : err;
  auto job = FollowJob(client, resp->job_id(), o, FollowOptions{}, live);
  if (!job.ok()) {
    if (job.status().code() == absl::StatusCode::kCancelled) {
      err << "psctl: stopped following " << resp->job_id() << " (it keeps running; cancel it with "
          << "psctl cancel " << resp->job_id() << ")" << std::endl;
      return 130;
    }
    return Fail(err, job.status());
  }
  if (table) {
    out << FinalSummary(*job) << std::endl;
  } else {
    Print(o, *job, out);
  }
  return ExitFor(*job);
}

// Follows a job's change of servers until it ends; prints each shard move as it ends.
int FollowChange(const PsctlOptions& o, SchedulerClient& client, const std::string& job_id,
                 int64_t since_ms, std::ostream& out, std::ostream& err) {
  int64_t shown_ms = since_ms;
  while (true) {
    if (o.interrupt != nullptr && o.interrupt->requested.load()) {
      err << "psctl: stopped following (the scheduler carries the change on)" << std::endl;
      return 130;
    }
    auto job = client.GetJob(job_id);
    if (!job.ok()) return Fail(err, job.status());
    for (const v1::ShardMove& m : job->moves()) {
      if (m.finished_unix_ms() == 0 || m.requested_unix_ms() <= shown_ms) continue;
      if (m.state() != v1::MOVE_DONE && m.state() != v1::MOVE_FAILED) continue;
      shown_ms = m.requested_unix_ms();
      out << "  " << job_id << ": shard " << m.shard() << " " << m.from() << " -> " << m.to()
          << (m.state() == v1::MOVE_DONE ? " done, " : " given up: ") << m.result() << std::endl;
    }
    const v1::ElasticChange& e = job->elastic();
    if (e.requested_unix_ms() >= since_ms && !e.active()) {
      out << job_id << ": " << e.result() << std::endl;
      return absl::StartsWith(e.result(), "done") ? 0 : 1;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

// Queues the move, then follows it until it is done or given up.
int MoveShard(const PsctlOptions& o, SchedulerClient& client, const std::string& job_id,
              uint32_t shard, const std::string& to, const std::string& from, std::ostream& out,
              std::ostream& err) {
  auto queued = client.MoveShard(job_id, shard, to, from);
  if (!queued.ok()) return Fail(err, queued.status());
  const v1::ShardMove& q = queued->move();
  if (o.output != OutputFormat::kTable) {
    Print(o, *queued, out);
    return 0;
  }
  out << "moving " << (q.backup() ? "a backup of shard " : "shard ") << q.shard() << " of "
      << job_id << " from " << q.from() << " to " << q.to() << std::endl;
  v1::ShardMoveState shown = q.state();
  while (true) {
    if (o.interrupt != nullptr && o.interrupt->requested.load()) {
      err << "psctl: stopped following the move (the scheduler carries it on)" << std::endl;
      return 130;
    }
    absl::SleepFor(absl::Milliseconds(100));
    auto job = client.GetJob(job_id);
    if (!job.ok()) return Fail(err, job.status());
    const v1::ShardMove* m = nullptr;
    for (const v1::ShardMove& each : job->moves()) {
      if (each.requested_unix_ms() == q.requested_unix_ms() && each.shard() == q.shard()) {
        m = &each;
      }
    }
    if (m == nullptr) {
      err << "psctl: the move is no longer listed in " << job_id << std::endl;
      return 1;
    }
    if (m->state() == shown) continue;
    shown = m->state();
    switch (shown) {
      case v1::MOVE_COPYING:
        out << "  copying: " << to << " takes a live copy and catches up" << std::endl;
        break;
      case v1::MOVE_DONE:
        out << "  done: " << m->result() << "; " << to
            << (m->backup() ? " holds the backup" : " is the primary") << " (map epoch "
            << m->epoch() << ")" << std::endl;
        return 0;
      case v1::MOVE_FAILED:
        err << "psctl: the move was given up: " << m->result() << std::endl;
        return 1;
      default:
        break;
    }
  }
}

int Status(const PsctlOptions& o, SchedulerClient& client, const std::string& job_id,
           std::ostream& out, std::ostream& err) {
  if (job_id.empty()) {
    auto st = client.ClusterStatus("");
    if (!st.ok()) return Fail(err, st.status());
    if (o.output != OutputFormat::kTable) {
      Print(o, *st, out);
      return 0;
    }
    out << NodesTable(*st) << "\n";
    v1::ListJobsResponse active;
    for (const v1::Job& j : st->jobs()) {
      if (scheduler::IsActive(j.state())) *active.add_jobs() = j;
    }
    out << (active.jobs_size() > 0 ? JobsTable(active, st->now_unix_ms()) : "No active jobs.\n");
    return 0;
  }
  if (o.watch) {
    if (o.interrupt) o.interrupt->handled = true;
    bool table = o.output == OutputFormat::kTable;
    FollowOptions f;
    f.detail = true;
    auto job = FollowJob(client, job_id, o, f, table ? out : err);
    if (!job.ok()) {
      return job.status().code() == absl::StatusCode::kCancelled ? 130 : Fail(err, job.status());
    }
    if (!table) Print(o, *job, out);
    return ExitFor(*job);
  }
  auto st = client.ClusterStatus(job_id, o.history);
  if (!st.ok()) return Fail(err, st.status());
  if (st->jobs_size() != 1) return Fail(err, absl::NotFoundError("job_id: no job '" + job_id + "'"));
  if (o.history) {
    if (o.output == OutputFormat::kTable) {
      out << HistoryText(st->jobs(0));
    } else {
      Print(o, st->jobs(0).history(), out);
    }
    return 0;
  }
  if (o.output != OutputFormat::kTable) {
    Print(o, st->jobs(0), out);
    return 0;
  }
  out << JobDetail(st->jobs(0), {st->nodes().begin(), st->nodes().end()}, st->now_unix_ms());
  return 0;
}

}  // namespace

std::vector<std::string> CandidatePaths(const std::string& self_path, const std::string& package,
                                        const std::string& name) {
  std::vector<std::string> out;
  std::string rel = package.empty() ? name : absl::StrCat(package, "/", name);
  if (const char* r = std::getenv("RUNFILES_DIR"); r != nullptr && *r) {
    out.push_back(absl::StrCat(r, "/pscluster/", rel));
  }
  if (!self_path.empty()) {
    out.push_back(absl::StrCat(self_path, ".runfiles/pscluster/", rel));
    std::string dir = self_path.substr(0, self_path.rfind('/'));
    // Bazel's output tree: bazel-bin/scheduler/psctl -> bazel-bin/<package>/<name>.
    out.push_back(absl::StrCat(dir, "/../", rel));
    // Installed side by side (/usr/bin/psctl, /usr/bin/ps_server).
    out.push_back(absl::StrCat(dir, "/", name));
  }
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY"); ws != nullptr && *ws) {
    out.push_back(absl::StrCat(ws, "/", rel));
    out.push_back(absl::StrCat(ws, "/bazel-bin/", rel));
  }
  out.push_back(rel);  // Relative to the working directory.
  return out;
}

int RunPsctl(const PsctlOptions& o, const std::vector<std::string>& args, std::ostream& out,
             std::ostream& err) {
  if (args.empty()) return Usage(err, "no command given");
  const std::string& cmd = args[0];
  auto want_args = [&](size_t n, const char* what) -> bool {
    if (args.size() == n + 1) return true;
    Usage(err, absl::StrCat(cmd, ": expected ", what));
    return false;
  };
  if (cmd == "up") {
    if (!want_args(0, "no arguments (flags only: --local, --detach, --job=FILE ...)")) return 2;
    if (!o.up.local) {
      return Usage(err, "up: only local clusters are supported: psctl up --local");
    }
    return RunUp(o, out, err);
  }
  if (cmd == "down") {
    if (!want_args(0, "no arguments")) return 2;
    return RunDown(o, out, err);
  }
  if (cmd == "help") {
    out << kUsage;
    return 0;
  }

  auto client = SchedulerClient::Connect(o.client);
  if (!client.ok()) return Fail(err, client.status());
  SchedulerClient& c = **client;
  if (cmd == "submit") {
    if (!want_args(1, "the job file: psctl submit FILE.yaml")) return 2;
    return Submit(o, c, args[1], out, err);
  }
  if (cmd == "jobs") {
    if (!want_args(0, "no arguments")) return 2;
    auto jobs = c.ListJobs(!o.active_only);
    if (!jobs.ok()) return Fail(err, jobs.status());
    if (o.output == OutputFormat::kTable) {
      out << JobsTable(*jobs, NowMs());
    } else {
      Print(o, *jobs, out);
    }
    return 0;
  }
  if (cmd == "status") {
    if (args.size() > 2) return Usage(err, "status: expected at most one job id");
    if (o.watch && args.size() < 2) return Usage(err, "status --watch: name the job to watch");
    if (o.history && args.size() < 2) return Usage(err, "status --history: name the job");
    if (o.history && o.watch) return Usage(err, "status: --history and --watch do not combine");
    return Status(o, c, args.size() == 2 ? args[1] : "", out, err);
  }
  if (cmd == "cancel") {
    if (!want_args(1, "the job id: psctl cancel JOB")) return 2;
    auto r = c.CancelJob(args[1], o.reason);
    if (!r.ok()) return Fail(err, r.status());
    if (o.output == OutputFormat::kTable) {
      out << args[1] << " " << scheduler::JobStateName(r->state()) << std::endl;
    } else {
      Print(o, *r, out);
    }
    return 0;
  }
  if (cmd == "nodes") {
    if (!want_args(0, "no arguments")) return 2;
    auto st = c.ClusterStatus("");
    if (!st.ok()) return Fail(err, st.status());
    if (o.output == OutputFormat::kTable) {
      out << NodesTable(*st);
    } else {
      v1::ClusterStatusResponse nodes;
      *nodes.mutable_nodes() = st->nodes();
      nodes.set_now_unix_ms(st->now_unix_ms());
      nodes.set_scheduler_version(st->scheduler_version());
      Print(o, nodes, out);
    }
    return 0;
  }
  if (cmd == "shards") {
    if (!want_args(1, "the job id: psctl shards JOB")) return 2;
    auto map = c.GetShardMap(args[1]);
    if (!map.ok()) return Fail(err, map.status());
    if (o.output != OutputFormat::kTable) {
      Print(o, *map, out);
      return 0;
    }
    auto st = c.ClusterStatus(args[1]);
    std::vector<v1::ShardLoad> loads;
    if (st.ok()) loads.assign(st->shard_loads().begin(), st->shard_loads().end());
    out << ShardsTable(*map, loads);
    return 0;
  }
  if (cmd == "checkpoint") {
    if (args.size() < 2 || args.size() > 3) {
      return Usage(err, "checkpoint: JOB [DIR]: psctl checkpoint job-1 /shared/ckpt");
    }
    auto written = c.CheckpointJob(args[1], args.size() == 3 ? args[2] : "");
    if (!written.ok()) return Fail(err, written.status());
    if (o.output != OutputFormat::kTable) {
      Print(o, *written, out);
      return 0;
    }
    for (const v1::CheckpointFile& f : written->files()) {
      out << f.server() << "  step " << f.step() << "  " << f.bytes() << " bytes  " << f.path()
          << std::endl;
    }
    return 0;
  }
  if (cmd == "export") {
    if (!want_args(1, "the job id: psctl export JOB [--to PATH]")) return 2;
    auto written = c.ExportJob(args[1], o.export_to);
    if (!written.ok()) return Fail(err, written.status());
    if (o.output != OutputFormat::kTable) {
      Print(o, *written, out);
      return 0;
    }
    out << args[1] << ": step " << written->step() << " exported to " << written->path() << " ("
        << written->bytes() << " bytes, by " << written->worker() << ")" << std::endl;
    return 0;
  }
  if (cmd == "logs") {
    if (!want_args(1, "the job id: psctl logs JOB [--rank N] [--follow]")) return 2;
    return RunLogs(o, c, args[1], out, err);
  }
  if (cmd == "scale") {
    if (!want_args(1, "the job id: psctl scale JOB --servers N")) return 2;
    if (o.scale_servers < 1) return Usage(err, "scale: --servers N (N >= 1) is required");
    auto queued = c.ScaleJob(args[1], static_cast<uint32_t>(o.scale_servers));
    if (!queued.ok()) return Fail(err, queued.status());
    if (o.output != OutputFormat::kTable) {
      Print(o, *queued, out);
      return 0;
    }
    out << "scaling " << args[1] << " to " << o.scale_servers << " servers: "
        << absl::StrJoin(queued->change().servers(), ", ") << std::endl;
    return FollowChange(o, c, args[1], queued->change().requested_unix_ms(), out, err);
  }
  if (cmd == "drain" || cmd == "undrain") {
    const std::string usage = absl::StrCat("the server's node id: psctl ", cmd, " server-2");
    if (!want_args(1, usage.c_str())) return 2;
    if (cmd == "undrain") {
      auto done = c.UndrainServer(args[1]);
      if (!done.ok()) return Fail(err, done.status());
      if (o.output != OutputFormat::kTable) {
        Print(o, *done, out);
      } else {
        out << args[1] << " is back in service" << std::endl;
      }
      return 0;
    }
    auto drain = c.DrainServer(args[1]);
    if (!drain.ok()) return Fail(err, drain.status());
    if (o.output != OutputFormat::kTable) {
      Print(o, *drain, out);
      return 0;
    }
    if (drain->jobs().empty()) {
      out << args[1] << " is drained: no job uses it" << std::endl;
      return 0;
    }
    out << "draining " << args[1] << ": moving the shards of " << absl::StrJoin(drain->jobs(), ", ")
        << std::endl;
    const int64_t since = absl::ToUnixMillis(absl::Now()) - 60000;  // Clocks may differ a bit.
    int rc = 0;
    for (const std::string& job : drain->jobs()) {
      rc = std::max(rc, FollowChange(o, c, job, since, out, err));
      if (rc == 130) return rc;
    }
    // The scheduler marks the server drained on its next pass.
    for (int i = 0; i < 100 && rc == 0; ++i) {
      auto st = c.ClusterStatus("");
      if (!st.ok()) return Fail(err, st.status());
      for (const v1::NodeStatus& n : st->nodes()) {
        if (n.info().node_id() == args[1] && n.drain() == v1::NODE_DRAINED) {
          out << args[1] << " is drained: it holds no job's shards and can be stopped" << std::endl;
          return 0;
        }
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
    if (rc == 0) out << args[1] << " is still draining (see psctl nodes)" << std::endl;
    return rc;
  }
  if (cmd == "move-shard") {
    if (args.size() != 5 &&
        !want_args(3, "JOB SHARD SERVER [FROM]: psctl move-shard job-1 7 s-2")) {
      return 2;
    }
    uint32_t shard = 0;
    if (!absl::SimpleAtoi(args[2], &shard)) {
      return Usage(err, absl::StrCat("move-shard: SHARD '", args[2], "' is not a shard number"));
    }
    return MoveShard(o, c, args[1], shard, args[3], args.size() == 5 ? args[4] : "", out, err);
  }
  return Usage(err, absl::StrCat("unknown command '", cmd, "'"));
}

}  // namespace pscluster::psctl
