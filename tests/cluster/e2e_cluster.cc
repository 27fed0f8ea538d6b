#include "tests/cluster/e2e_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "common/atomic_file.h"
#include "common/channel.h"
#include "common/status_convert.h"
#include "google/protobuf/util/json_util.h"
#include "proto/ps.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "scheduler/job_state.h"

namespace pscluster::testing {

std::string SchedulerBinary() { return Runfile("scheduler/ps_scheduler"); }
std::string ServerBinary() { return Runfile("server/ps_server"); }
std::string WorkerBinary() { return Runfile("worker/ps_worker"); }
std::string PsctlBinary() { return Runfile("scheduler/psctl"); }

std::string FashionJobYaml(const std::string& name, int epochs, const std::string& export_path,
                           int hidden) {
  std::string yaml = absl::StrCat(
      "name: ", name,
      "\n"
      "model:\n"
      "  kind: mlp\n"
      "  hidden: [", hidden,
      "]\n"
      "dataset:\n"
      "  name: fashion_mnist\n"
      "optimizer:\n"
      "  kind: adam\n"
      "  learning_rate: 0.002\n"
      "consistency:\n"
      "  mode: bsp\n"
      "num_servers: 2\n"
      "num_workers: 2\n"
      "gpus_per_worker: 0\n"
      "device: cpu\n"
      "epochs: ", epochs,
      "\n"
      "batch_size: 100\n"
      "eval_batch_size: 1000\n"
      "num_virtual_shards: 16\n"
      "seed: 7\n");
  if (!export_path.empty()) absl::StrAppend(&yaml, "export_path: ", export_path, "\n");
  return yaml;
}

absl::StatusOr<std::unique_ptr<BackgroundCommand>> BackgroundCommand::Start(
    const std::string& binary, const std::vector<std::string>& args,
    const std::string& output_file) {
  std::unique_ptr<BackgroundCommand> c(new BackgroundCommand());
  c->output_file_ = output_file;
  psctl::SpawnOptions o;
  o.binary = binary;
  o.args = args;
  o.log_file = output_file;
  auto proc = psctl::Subprocess::Spawn(o);
  if (!proc.ok()) return proc.status();
  c->proc_ = std::move(*proc);
  return c;
}

int BackgroundCommand::Wait(absl::Duration timeout) {
  absl::Time end = absl::Now() + timeout;
  while (!proc_->Poll().has_value() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(20));
  if (proc_->Poll().has_value()) return *proc_->Poll();
  proc_->Terminate(absl::Seconds(2));
  return -1;
}

std::string BackgroundCommand::Output() const {
  auto text = ReadFile(output_file_);
  return text.ok() ? *text : "";
}

absl::StatusOr<std::unique_ptr<E2eCluster>> E2eCluster::Start(const std::string& name,
                                                              E2eClusterOptions options) {
  std::unique_ptr<E2eCluster> c(new E2eCluster());
  c->dir_ = TestDir(name);
  psctl::LocalClusterOptions lo;
  lo.scheduler_bin = SchedulerBinary();
  lo.server_bin = ServerBinary();
  lo.worker_bin = WorkerBinary();
  lo.num_servers = options.servers;
  lo.num_workers = options.workers;
  lo.work_dir = c->dir_ + "/cluster";
  lo.device = "cpu";
  lo.startup_timeout = options.startup_timeout;
  lo.token = options.admin_token;
  if (!options.admin_token.empty()) {
    c->admin_token_file_ = c->dir_ + "/psctl-admin.token";
    absl::Status st = WriteFileAtomically(c->admin_token_file_, options.admin_token + "\n");
    if (!st.ok()) return st;
  }
  lo.scheduler_args = {"--startup_grace_ms=200", "--lease_ms=4000", "--db_sync=normal",
                      "--rebalance_every_ms=0",
                       "--metrics_listen=127.0.0.1:0"};
  lo.scheduler_args.insert(lo.scheduler_args.end(), options.scheduler_args.begin(),
                           options.scheduler_args.end());
  lo.server_args = options.server_args;
  lo.worker_args = {"--cpu_threads=1"};
  lo.worker_args.insert(lo.worker_args.end(), options.worker_args.begin(),
                        options.worker_args.end());
  std::ostringstream progress;
  auto cluster = psctl::LocalCluster::Start(lo, progress);
  if (!cluster.ok()) {
    return absl::Status(cluster.status().code(),
                        absl::StrCat(cluster.status().message(), "\n", progress.str()));
  }
  c->cluster_ = std::move(*cluster);
  psctl::ClientOptions co;
  co.address = c->cluster_->scheduler_address();
  co.timeout = absl::Seconds(5);
  co.channel.bearer_token = options.admin_token;
  auto client = psctl::SchedulerClient::Connect(co);
  if (!client.ok()) return client.status();
  c->client_ = std::move(*client);
  return c;
}

E2eCluster::~E2eCluster() {
  if (cluster_) cluster_->Stop();
}

CommandResult E2eCluster::Psctl(std::vector<std::string> args, absl::Duration timeout) const {
  args.insert(args.begin(), {absl::StrCat("--scheduler=", scheduler_address()),
                             "--interval=100ms"});
  const bool has_token =
      std::any_of(args.begin(), args.end(),
                  [](const std::string& a) { return a.rfind("--token_file", 0) == 0; });
  if (!admin_token_file_.empty() && !has_token) {
    args.insert(args.begin(), "--token_file=" + admin_token_file_);
  }
  return RunCommand(PsctlBinary(), args, timeout);
}

absl::StatusOr<std::unique_ptr<BackgroundCommand>> E2eCluster::StartPsctl(
    std::vector<std::string> args) const {
  static int counter = 0;
  args.insert(args.begin(), {absl::StrCat("--scheduler=", scheduler_address()),
                             "--interval=100ms"});
  const bool has_token =
      std::any_of(args.begin(), args.end(),
                  [](const std::string& a) { return a.rfind("--token_file", 0) == 0; });
  if (!admin_token_file_.empty() && !has_token) {
    args.insert(args.begin(), "--token_file=" + admin_token_file_);
  }
  return BackgroundCommand::Start(PsctlBinary(), args,
                                  absl::StrCat(dir_, "/psctl-", ++counter, ".out"));
}

std::string E2eCluster::WriteFile(const std::string& name, const std::string& text) const {
  std::string path = absl::StrCat(dir_, "/", name);
  std::ofstream(path) << text;
  return path;
}

absl::StatusOr<v1::Job> E2eCluster::JobViaPsctl(const std::string& job_id) const {
  CommandResult r = Psctl({"status", job_id, "-o", "json"}, absl::Seconds(30));
  if (r.exit_code != 0) {
    return absl::InternalError(
        absl::StrCat("psctl status ", job_id, " -o json exited with ", r.exit_code, ": ",
                     r.output));
  }
  v1::Job job;
  auto s = google::protobuf::util::JsonStringToMessage(r.output, &job);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("psctl status -o json printed something that is not "
                                            "a Job: ", s.ToString(), "\n", r.output));
  }
  return job;
}

absl::StatusOr<v1::Job> E2eCluster::GetJob(const std::string& job_id) const {
  return client_->GetJob(job_id);
}

absl::StatusOr<v1::ShardMap> E2eCluster::GetShardMap(const std::string& job_id) const {
  return client_->GetShardMap(job_id);
}

absl::StatusOr<v1::ClusterStatusResponse> E2eCluster::ClusterStatus() const {
  return client_->ClusterStatus("");
}

absl::StatusOr<v1::WorkerStatus> E2eCluster::WorkerStatus(const std::string& name) const {
  std::string address = cluster_->Address(name);
  if (address.empty()) return absl::NotFoundError(absl::StrCat("no process named ", name));
  return WorkerStatusAt(address);
}

absl::StatusOr<E2eCluster::ExtraDaemon> E2eCluster::StartWorker(
    const std::string& name, const std::string& scheduler) const {
  return StartDaemonIn(dir_, WorkerBinary(), name,
                     {absl::StrCat("--scheduler=", scheduler), "--device=cpu", "--cpu_threads=1"});
}

absl::StatusOr<E2eCluster::ExtraDaemon> E2eCluster::StartServer(
    const std::string& name, const std::string& scheduler) const {
  return StartDaemonIn(dir_, ServerBinary(), name,
                     {absl::StrCat("--scheduler=", scheduler),
                      absl::StrCat("--checkpoint_dir=", dir_, "/", name, "-checkpoints")});
}

absl::StatusOr<StartedDaemon> StartDaemonIn(const std::string& dir, const std::string& binary,
                                            const std::string& name,
                                            std::vector<std::string> args) {
  StartedDaemon w;
  w.log = absl::StrCat(dir, "/", name, ".log");
  const std::string port_file = absl::StrCat(dir, "/", name, ".port");
  std::remove(port_file.c_str());
  args.push_back("--listen=127.0.0.1:0");
  args.push_back("--log_level=info");
  args.push_back(absl::StrCat("--port_file=", port_file));
  auto proc = BackgroundCommand::Start(binary, args, w.log);
  if (!proc.ok()) return proc.status();
  w.process = std::move(*proc);
  const bool up = WaitFor(absl::Seconds(30), [&] {
    auto text = ReadFile(port_file);
    if (!text.ok()) return false;
    w.address = std::string(absl::StripAsciiWhitespace(*text));
    return !w.address.empty();
  });
  if (!up) {
    return absl::DeadlineExceededError(absl::StrCat(name, " did not report its port:\n",
                                                    w.process->Output()));
  }
  return w;
}

absl::StatusOr<v1::WorkerStatus> E2eCluster::WorkerStatusAt(const std::string& address) {
  auto channel = MakeChannel(address);
  if (!channel.ok()) return channel.status();
  auto stub = v1::WorkerControl::NewStub(*channel);
  auto ctx = CallContext(absl::Seconds(5));
  v1::WorkerStatusRequest req;
  v1::WorkerStatus resp;
  absl::Status s = FromGrpcStatus(stub->Status(ctx.get(), req, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::ServerStatus> E2eCluster::ServerStatus(const std::string& name) const {
  std::string address = cluster_->Address(name);
  if (address.empty()) return absl::NotFoundError(absl::StrCat("no process named ", name));
  return ServerStatusAt(address);
}

absl::StatusOr<v1::ServerStatus> E2eCluster::ServerStatusAt(const std::string& address) {
  auto channel = MakeChannel(address);
  if (!channel.ok()) return channel.status();
  auto stub = v1::ParameterServer::NewStub(*channel);
  auto ctx = CallContext(absl::Seconds(5));
  v1::ServerStatusRequest req;
  v1::ServerStatus resp;
  absl::Status s = FromGrpcStatus(stub->Status(ctx.get(), req, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<std::string> E2eCluster::SchedulerMetrics() const {
  // The last "metrics at http://127.0.0.1:PORT/metrics" the scheduler logged (it may have
  // restarted).
  std::string log = ReadFile(cluster_->LogFile("scheduler")).value_or("");
  const std::string marker = "metrics at http://127.0.0.1:";
  size_t at = log.rfind(marker);
  int port = 0;
  if (at == std::string::npos ||
      !absl::SimpleAtoi(log.substr(at + marker.size(),
                                   log.find('/', at + marker.size()) - at - marker.size()),
                        &port)) {
    return absl::NotFoundError("the scheduler's log names no metrics endpoint");
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to 127.0.0.1:", port));
  }
  const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
  (void)!::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string reply;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) reply.append(buf, n);
  ::close(fd);
  if (reply.rfind("HTTP/1.0 200", 0) != 0) {
    return absl::InternalError(absl::StrCat("GET /metrics: ", reply.substr(0, 200)));
  }
  return reply.substr(reply.find("\r\n\r\n") + 4);
}

absl::StatusOr<v1::Job> E2eCluster::WaitForEnd(const std::string& job_id,
                                               absl::Duration timeout) const {
  absl::StatusOr<v1::Job> job = absl::UnavailableError("not asked yet");
  WaitFor(timeout, [&] {
    job = GetJob(job_id);
    return job.ok() && scheduler::IsTerminal(job->state());
  });
  if (!job.ok()) return job.status();
  if (!scheduler::IsTerminal(job->state())) {
    return absl::DeadlineExceededError(absl::StrCat(
        job_id, " did not end within ", absl::FormatDuration(timeout), "; last seen:\n",
        job->DebugString()));
  }
  return job;
}

std::string E2eCluster::LogTails(int lines) const {
  std::string out;
  for (const std::string& name : cluster_->Names()) {
    absl::StrAppend(&out, "---- ", name, " (", cluster_->LogFile(name), ")\n",
                    psctl::TailOfFile(cluster_->LogFile(name), lines));
  }
  return out;
}

}  // namespace pscluster::testing
