#include "tests/netsim/netsim_cluster.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/testing/wait_for.h"
#include "scheduler/job_state.h"
#include "scheduler/psctl/local_cluster.h"
#include "tests/cluster/e2e_cluster.h"

namespace pscluster::testing {

bool IsUnsupported(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         absl::StrContains(status.message(), "netsim");
}

absl::StatusOr<std::unique_ptr<NetsimCluster>> NetsimCluster::Start(const std::string& name,
                                                                    NetsimClusterOptions o) {
  std::unique_ptr<NetsimCluster> c(new NetsimCluster());
  c->dir_ = TestDir(name);
  auto net = netsim::Network::Create();
  if (!net.ok()) return net.status();
  c->net_ = std::move(*net);
  std::vector<std::string> hosts = {"scheduler"};
  for (int i = 1; i <= o.servers; ++i) hosts.push_back(absl::StrCat("server-", i));
  for (int i = 1; i <= o.workers; ++i) hosts.push_back(absl::StrCat("worker-", i));
  for (const std::string& h : hosts) {
    auto added = c->net_->AddHost(h, o.rate);
    if (!added.ok()) return added.status();
  }
  auto ctl = c->net_->AddHost("ctl", "");
  if (!ctl.ok()) return ctl.status();
  absl::Status st = c->net_->Enter("ctl");
  if (!st.ok()) return st;

  std::vector<std::string> sched = {"--startup_grace_ms=200", "--lease_ms=4000", "--db_sync=normal",
                                    "--rebalance_every_ms=0",
                                    absl::StrCat("--db=", c->dir_, "/scheduler.db")};
  sched.insert(sched.end(), o.scheduler_args.begin(), o.scheduler_args.end());
  st = c->Launch("scheduler", Runfile("scheduler/ps_scheduler"), sched);
  if (!st.ok()) return st;
  c->scheduler_address_ = c->daemons_.back().address;
  const std::string to_scheduler = "--scheduler=" + c->scheduler_address_;
  for (int i = 1; i <= o.servers; ++i) {
    const std::string host = absl::StrCat("server-", i);
    std::vector<std::string> args = {
        to_scheduler, absl::StrCat("--checkpoint_dir=", c->dir_, "/", host, "-checkpoints")};
    args.insert(args.end(), o.server_args.begin(), o.server_args.end());
    st = c->Launch(host, Runfile("server/ps_server"), args);
    if (!st.ok()) return st;
  }
  for (int i = 1; i <= o.workers; ++i) {
    std::vector<std::string> args = {to_scheduler, "--device=cpu", "--cpu_threads=1"};
    args.insert(args.end(), o.worker_args.begin(), o.worker_args.end());
    st = c->Launch(absl::StrCat("worker-", i), Runfile("worker/ps_worker"), args);
    if (!st.ok()) return st;
  }

  psctl::ClientOptions co;
  co.address = c->scheduler_address_;
  co.timeout = absl::Seconds(5);
  auto client = psctl::SchedulerClient::Connect(co);
  if (!client.ok()) return client.status();
  c->client_ = std::move(*client);
  // Every daemon registered and alive, and each node id known by host.
  const bool up = WaitFor(o.startup_timeout, [&] {
    auto cs = c->ClusterStatus();
    if (!cs.ok()) return false;
    int alive = 0;
    for (const v1::NodeStatus& n : cs->nodes()) alive += n.state() == v1::NODE_ALIVE;
    return alive == o.servers + o.workers;
  });
  if (!up) {
    return absl::DeadlineExceededError(
        absl::StrCat("the scheduler did not list every daemon as alive within ",
                     absl::FormatDuration(o.startup_timeout), "\n", c->LogTails()));
  }
  for (Daemon& d : c->daemons_) {
    if (absl::StartsWith(d.host, "server-")) {
      auto s = E2eCluster::ServerStatusAt(d.address);
      if (s.ok()) d.node_id = s->node_id();
    } else if (absl::StartsWith(d.host, "worker-")) {
      auto w = E2eCluster::WorkerStatusAt(d.address);
      if (w.ok()) d.node_id = w->node_id();
    }
  }
  return c;
}

absl::Status NetsimCluster::Launch(const std::string& host, const std::string& binary,
                                   std::vector<std::string> args) {
  auto h = net_->host(host);
  if (!h.ok()) return h.status();
  Daemon d;
  d.host = host;
  d.log = absl::StrCat(dir_, "/", host, ".log");
  const std::string port_file = absl::StrCat(dir_, "/", host, ".port");
  std::remove(port_file.c_str());
  args.push_back(absl::StrCat("--listen=", h->address, ":0"));
  args.push_back(absl::StrCat("--port_file=", port_file));
  args.push_back("--log_level=info");
  args.insert(args.begin(), binary);
  std::vector<std::string> argv = net_->Command(host, args);
  psctl::SpawnOptions so;
  so.binary = argv[0];
  so.args.assign(argv.begin() + 1, argv.end());
  so.log_file = d.log;
  auto proc = psctl::Subprocess::Spawn(so);
  if (!proc.ok()) return proc.status();
  d.proc = std::move(*proc);
  const bool listening = WaitFor(absl::Seconds(30), [&] {
    auto text = ReadFile(port_file);
    if (!text.ok()) return d.proc->Poll().has_value();
    d.address = std::string(absl::StripAsciiWhitespace(*text));
    return !d.address.empty();
  });
  if (!listening || d.address.empty()) {
    return absl::UnavailableError(absl::StrCat(host, " (", binary, ") did not report its port:\n",
                                               psctl::TailOfFile(d.log, 30)));
  }
  daemons_.push_back(std::move(d));
  return absl::OkStatus();
}

NetsimCluster::~NetsimCluster() {
  // Workers, servers, then the scheduler; the network last.
  for (auto it = daemons_.rbegin(); it != daemons_.rend(); ++it) {
    if (it->proc) it->proc->Terminate(absl::Seconds(5));
  }
  daemons_.clear();
  client_.reset();
  if (net_) (void)net_->Destroy();
}

const NetsimCluster::Daemon* NetsimCluster::Find(const std::string& host) const {
  for (const Daemon& d : daemons_) {
    if (d.host == host) return &d;
  }
  return nullptr;
}

std::string NetsimCluster::Address(const std::string& host) const {
  const Daemon* d = Find(host);
  return d ? d->address : "";
}

std::string NetsimCluster::LogFile(const std::string& host) const {
  const Daemon* d = Find(host);
  return d ? d->log : "";
}

std::string NetsimCluster::HostOfNode(const std::string& node_id) const {
  for (const Daemon& d : daemons_) {
    if (!node_id.empty() && d.node_id == node_id) return d.host;
  }
  return "";
}

CommandResult NetsimCluster::Psctl(std::vector<std::string> args, absl::Duration timeout) const {
  args.insert(args.begin(), {absl::StrCat("--scheduler=", scheduler_address_), "--interval=100ms"});
  return RunCommand(Runfile("scheduler/psctl"), args, timeout);
}

std::string NetsimCluster::WriteFile(const std::string& name, const std::string& text) const {
  std::string path = absl::StrCat(dir_, "/", name);
  std::ofstream(path) << text;
  return path;
}

absl::StatusOr<v1::Job> NetsimCluster::GetJob(const std::string& job_id) const {
  return client_->GetJob(job_id);
}

absl::StatusOr<v1::ClusterStatusResponse> NetsimCluster::ClusterStatus() const {
  return client_->ClusterStatus("");
}

std::optional<v1::NodeState> NetsimCluster::NodeState(const std::string& node_id) const {
  auto cs = ClusterStatus();
  if (!cs.ok()) return std::nullopt;
  for (const v1::NodeStatus& n : cs->nodes()) {
    if (n.info().node_id() == node_id) return n.state();
  }
  return std::nullopt;
}

absl::StatusOr<v1::Job> NetsimCluster::WaitForEnd(const std::string& job_id,
                                                  absl::Duration timeout) const {
  absl::StatusOr<v1::Job> job = absl::UnavailableError("not asked yet");
  WaitFor(timeout, [&] {
    job = GetJob(job_id);
    return job.ok() && scheduler::IsTerminal(job->state());
  });
  if (!job.ok()) return job.status();
  if (!scheduler::IsTerminal(job->state())) {
    return absl::DeadlineExceededError(absl::StrCat(job_id, " did not end within ",
                                                    absl::FormatDuration(timeout), "; last seen:\n",
                                                    job->DebugString()));
  }
  return job;
}

std::string NetsimCluster::LogTails(int lines) const {
  std::string out;
  for (const Daemon& d : daemons_) {
    absl::StrAppend(&out, "---- ", d.host, " (", d.log, ")\n", psctl::TailOfFile(d.log, lines));
  }
  return out;
}

}  // namespace pscluster::testing
