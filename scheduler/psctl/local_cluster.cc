#include "scheduler/psctl/local_cluster.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <deque>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/atomic_file.h"
#include "common/channel.h"
#include "proto/grpc_health.grpc.pb.h"
#include "scheduler/psctl/client.h"

namespace pscluster::psctl {
namespace {

constexpr absl::Duration kPoll = absl::Milliseconds(25);

}  // namespace

std::string TailOfFile(const std::string& path, int lines) {
  std::ifstream f(path);
  if (!f.good()) return "";
  std::deque<std::string> last;
  std::string line;
  while (std::getline(f, line)) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const std::string& l : last) absl::StrAppend(&out, "    ", l, "\n");
  return out;
}

std::string LocalCluster::Tail(const Child& c) const {
  std::string tail = TailOfFile(c.log, 15);
  if (tail.empty()) return absl::StrCat(" (its log ", c.log, " is empty)");
  return absl::StrCat("; last lines of ", c.log, ":\n", tail);
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options, std::ostream& progress) {
  // Every binary is checked before anything starts.
  const std::pair<const std::string*, const char*> bins[] = {
      {&options.scheduler_bin, "--scheduler_bin"},
      {&options.server_bin, "--server_bin"},
      {&options.worker_bin, "--worker_bin"}};
  for (const auto& [path, flag] : bins) {
    if (path->empty() || access(path->c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "binary not found or not executable: '", *path, "' (build it with bazel, or set ",
          flag, ")"));
    }
  }
  if (options.num_servers < 1 || options.num_workers < 1) {
    return absl::InvalidArgumentError("--servers and --workers must be >= 1");
  }
  for (const char* sub : {"", "/logs", "/ports", "/checkpoints"}) {
    absl::Status s = MakeDirs(options.work_dir + sub);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--work_dir: ", s.message()));
  }
  // A local cluster is new each time: no jobs or nodes of an earlier run.
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::remove(absl::StrCat(options.work_dir, "/scheduler.db", suffix).c_str());
  }
  std::unique_ptr<LocalCluster> c(new LocalCluster(options));
  const std::string level = absl::StrCat("--log_level=", options.log_level);
  std::vector<std::string> sched_args = {
      "--listen=127.0.0.1:0", absl::StrCat("--db=", options.work_dir, "/scheduler.db"), level};
  sched_args.insert(sched_args.end(), options.scheduler_args.begin(),
                    options.scheduler_args.end());
  absl::Status s = c->Launch("scheduler", options.scheduler_bin, sched_args, progress);
  if (!s.ok()) return s;
  c->scheduler_address_ = c->children_.back().address;
  const std::string sched = absl::StrCat("--scheduler=", c->scheduler_address_);
  for (int i = 1; i <= options.num_servers; ++i) {
    std::vector<std::string> args = {
        "--listen=127.0.0.1:0", sched, level,
        absl::StrCat("--checkpoint_dir=", options.work_dir, "/checkpoints/server-", i)};
    args.insert(args.end(), options.server_args.begin(), options.server_args.end());
    s = c->Launch(absl::StrCat("server-", i), options.server_bin, args, progress);
    if (!s.ok()) return s;
  }
  for (int i = 1; i <= options.num_workers; ++i) {
    // The user's own machine and user: jobs with an entrypoint run here too.
    std::vector<std::string> args = {"--listen=127.0.0.1:0", sched, level,
                                     absl::StrCat("--device=", options.device),
                                     "--allow_entrypoints"};
    args.insert(args.end(), options.worker_args.begin(), options.worker_args.end());
    s = c->Launch(absl::StrCat("worker-", i), options.worker_bin, args, progress);
    if (!s.ok()) return s;
  }
  s = c->WaitForNodes();
  if (!s.ok()) return s;
  progress << "local cluster ready: scheduler at " << c->scheduler_address_ << ", "
           << options.num_servers << " servers, " << options.num_workers << " workers (logs in "
           << options.work_dir << "/logs)" << std::endl;
  return c;
}

absl::Status LocalCluster::Launch(const std::string& name, const std::string& binary,
                                  std::vector<std::string> args, std::ostream& progress) {
  Child child;
  child.name = name;
  child.binary = binary;
  child.args = args;
  child.log = absl::StrCat(options_.work_dir, "/logs/", name, ".log");
  std::remove(child.log.c_str());
  Child& c = children_.emplace_back(std::move(child));
  return Spawn(c, std::move(args), progress);
}

absl::Status LocalCluster::Spawn(Child& c, std::vector<std::string> args,
                                 std::ostream& progress) {
  const std::string& name = c.name;
  const std::string& binary = c.binary;
  std::string port_file = absl::StrCat(options_.work_dir, "/ports/", name, ".port");
  std::remove(port_file.c_str());
  args.push_back(absl::StrCat("--port_file=", port_file));
  SpawnOptions so;
  so.binary = binary;
  so.args = std::move(args);
  so.log_file = c.log;
  so.die_with_parent = !options_.detach;
  so.new_session = options_.detach;
  auto proc = Subprocess::Spawn(so);
  if (!proc.ok()) return proc.status();
  c.proc = std::move(*proc);

  // Its address, from the port file it writes once listening.
  absl::Time end = absl::Now() + options_.startup_timeout;
  while (true) {
    if (options_.interrupted()) return absl::CancelledError("interrupted while starting");
    if (auto code = c.proc->Poll(); code.has_value()) {
      return absl::UnavailableError(absl::StrCat(name, " (", binary, ") exited with code ", *code,
                                                 " before listening", Tail(c)));
    }
    auto text = ReadFile(port_file);
    if (text.ok()) {
      std::string addr(absl::StripAsciiWhitespace(*text));
      if (!addr.empty()) {
        c.address = addr;
        break;
      }
    }
    if (absl::Now() > end) {
      return absl::DeadlineExceededError(absl::StrCat(
          name, " (", binary, ") did not write its port file ", port_file, " within ",
          absl::FormatDuration(options_.startup_timeout), Tail(c)));
    }
    absl::SleepFor(kPoll);
  }
  // Then SERVING on grpc.health.v1.
  ChannelOptions health_channel;
  health_channel.tls = options_.tls;
  auto channel = MakeChannel(c.address, health_channel);
  if (!channel.ok()) return channel.status();
  auto health = grpc::health::v1::Health::NewStub(*channel);
  while (true) {
    if (options_.interrupted()) return absl::CancelledError("interrupted while starting");
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    auto ctx = CallContext(absl::Seconds(1));
    grpc::Status st = health->Check(ctx.get(), req, &resp);
    if (st.ok() && resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) break;
    if (auto code = c.proc->Poll(); code.has_value()) {
      return absl::UnavailableError(absl::StrCat(name, " (", binary, ") exited with code ", *code,
                                                 Tail(c)));
    }
    if (absl::Now() > end) {
      return absl::DeadlineExceededError(absl::StrCat(
          name, " at ", c.address, " did not report SERVING within ",
          absl::FormatDuration(options_.startup_timeout), Tail(c)));
    }
    absl::SleepFor(kPoll);
  }
  progress << "started " << name << " (pid " << c.proc->pid() << ") at " << c.address
           << std::endl;
  return absl::OkStatus();
}

absl::Status LocalCluster::WaitForNodes() {
  ClientOptions co;
  co.address = scheduler_address_;
  co.timeout = absl::Seconds(2);
  co.channel.bearer_token = options_.token;
  co.channel.tls = options_.tls;
  auto client = SchedulerClient::Connect(co);
  if (!client.ok()) return client.status();
  absl::Time end = absl::Now() + options_.startup_timeout;
  int servers = 0, workers = 0;
  while (true) {
    if (options_.interrupted()) return absl::CancelledError("interrupted while starting");
    absl::Status alive = CheckAlive();
    if (!alive.ok()) return alive;
    auto st = (*client)->ClusterStatus("");
    if (st.ok()) {
      servers = workers = 0;
      for (const v1::NodeStatus& n : st->nodes()) {
        if (n.state() != v1::NODE_ALIVE) continue;
        if (n.info().role() == v1::ROLE_SERVER) ++servers;
        if (n.info().role() == v1::ROLE_WORKER) ++workers;
      }
      if (servers >= options_.num_servers && workers >= options_.num_workers) {
        return absl::OkStatus();
      }
    }
    if (absl::Now() > end) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the scheduler at ", scheduler_address_, " lists ", servers, " of ",
          options_.num_servers, " servers and ", workers, " of ", options_.num_workers,
          " workers as alive after ", absl::FormatDuration(options_.startup_timeout),
          " (do they register? see the logs in ", options_.work_dir, "/logs)"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

LocalCluster::~LocalCluster() {
  if (released_) {
    for (Child& c : children_) c.proc->Release();
    return;
  }
  Stop();
}

std::vector<std::string> LocalCluster::Describe() const {
  std::vector<std::string> out;
  for (const Child& c : children_) {
    out.push_back(absl::StrCat(c.name, " ", c.proc->pid(), " ", c.binary));
  }
  return out;
}

absl::Status LocalCluster::CheckAlive() {
  for (Child& c : children_) {
    if (auto code = c.proc->Poll(); code.has_value()) {
      return absl::UnavailableError(absl::StrCat(c.name, " (pid ", c.proc->pid(), ", ", c.binary,
                                                 ") exited with code ", *code, Tail(c)));
    }
  }
  return absl::OkStatus();
}

int LocalCluster::Stop() {
  int running = 0;
  // Workers first (they report to the others), then servers, then the scheduler.
  for (const char* prefix : {"worker-", "server-", "scheduler"}) {
    for (Child& c : children_) {
      if (c.name.rfind(prefix, 0) != 0) continue;
      if (!c.proc->Poll().has_value()) ++running;
      c.proc->Terminate(options_.stop_grace);
    }
  }
  return running;
}

void LocalCluster::Release() { released_ = true; }

LocalCluster::Child* LocalCluster::Find(const std::string& name) {
  for (Child& c : children_) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

const LocalCluster::Child* LocalCluster::Find(const std::string& name) const {
  for (const Child& c : children_) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::vector<std::string> LocalCluster::Names() const {
  std::vector<std::string> names;
  for (const Child& c : children_) names.push_back(c.name);
  return names;
}

pid_t LocalCluster::Pid(const std::string& name) const {
  const Child* c = Find(name);
  return c == nullptr ? -1 : c->proc->pid();
}

std::string LocalCluster::Address(const std::string& name) const {
  const Child* c = Find(name);
  return c == nullptr ? "" : c->address;
}

std::string LocalCluster::LogFile(const std::string& name) const {
  const Child* c = Find(name);
  return c == nullptr ? "" : c->log;
}

absl::Status LocalCluster::Signal(const std::string& name, int signal) {
  Child* c = Find(name);
  if (c == nullptr) return absl::NotFoundError(absl::StrCat("no process named '", name, "'"));
  if (c->proc->Poll().has_value()) return absl::OkStatus();
  if (signal == SIGKILL) {
    ::kill(c->proc->pid(), SIGKILL);
    c->proc->Terminate(absl::ZeroDuration());  // Reaps it.
    return absl::OkStatus();
  }
  if (::kill(c->proc->pid(), signal) != 0) {
    return absl::InternalError(absl::StrCat("kill(", c->proc->pid(), ", ", signal, "): ",
                                            static_cast<const char*>(strerror(errno))));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::Restart(const std::string& name, std::ostream& progress) {
  Child* c = Find(name);
  if (c == nullptr) return absl::NotFoundError(absl::StrCat("no process named '", name, "'"));
  if (!c->proc->Poll().has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " (pid ", c->proc->pid(), ") is still running"));
  }
  std::vector<std::string> args = c->args;
  for (std::string& a : args) {
    if (a.rfind("--listen=", 0) == 0 && !c->address.empty()) a = "--listen=" + c->address;
  }
  progress << "restarting " << name << " at " << c->address << std::endl;
  return Spawn(*c, std::move(args), progress);
}

absl::Status LocalCluster::WriteStateFile(const std::string& path) const {
  std::string text = absl::StrCat("scheduler ", scheduler_address_, "\n");
  if (!options_.credential_file.empty()) {
    absl::StrAppend(&text, "credential ", options_.credential_file, "\n");
  }
  if (options_.tls.enabled()) {
    absl::StrAppend(&text, "tls_ca ", options_.tls.ca, "\ntls_cert ", options_.tls.cert,
                    "\ntls_key ", options_.tls.key, "\n");
  }
  for (const Child& c : children_) {
    absl::StrAppend(&text, "process ", c.name, " ", c.proc->pid(), " ", c.binary, "\n");
  }
  return WriteFileAtomically(path, text);
}

absl::StatusOr<int> LocalCluster::StopFromStateFile(const std::string& path, absl::Duration grace,
                                                    std::ostream& progress) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  struct Proc {
    std::string name;
    pid_t pid;
    std::string binary;
  };
  std::vector<Proc> procs;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 3));
    int pid = 0;
    if (f.size() == 4 && f[0] == "process" && absl::SimpleAtoi(f[2], &pid) && pid > 1) {
      procs.push_back({f[1], pid, f[3]});
    }
  }
  int stopped = 0;
  for (const char* prefix : {"worker-", "server-", "scheduler"}) {
    for (const Proc& p : procs) {
      if (p.name.rfind(prefix, 0) != 0) continue;
      if (!PidRuns(p.pid, p.binary)) continue;  // Gone already (or the pid was reused).
      bool ok = TerminatePid(p.pid, grace);
      progress << (ok ? "stopped " : "could not stop ") << p.name << " (pid " << p.pid << ")"
               << std::endl;
      if (ok) ++stopped;
    }
  }
  std::remove(path.c_str());
  return stopped;
}

}  // namespace pscluster::psctl
