// Training throughput through the parameter servers against the same model trained in one
// process, measured in the same run (issue: distribution overhead).
//
//   training_bench [--epochs=1] [--batch=128] [--repeats=1] [--hidden=512,256] [--server_bin=PATH]
//
// Rows, each the MLP on Fashion-MNIST with the CPU backend:
//   single process   model + Adam applied in-process (the servers' own update code), no PS
//   1 server x 1     a real ps_server process on loopback + one worker training loop
//   1 server x 2     the same server + two workers (samples/s summed)
// The ratio column divides by the single-process rate. A per-step breakdown (pull wait,
// compute, push wait) shows where the cluster's time goes; a CPU table (tests/bench/cpu_usage.h)
// shows how many cores each row kept busy and how much CPU it spent per sample, which bounds the
// ratio a row can reach on the same cores.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/atomic_file.h"
#include "common/channel.h"
#include "common/logging.h"
#include "proto/ps.grpc.pb.h"
#include "scheduler/psctl/subprocess.h"
#include "tests/bench/cpu_usage.h"
#include "tests/bench/one_process_training.h"
#include "worker/data/fashion_mnist.h"
#include "worker/standalone.h"
#include "worker/trainer.h"

ABSL_FLAG(int, epochs, 1, "epochs per measured run");
ABSL_FLAG(int, batch, 128, "examples per step per worker");
ABSL_FLAG(std::string, hidden, "512,256", "MLP hidden widths");
ABSL_FLAG(int, cpu_threads, 0, "CPU backend threads (0 = all cores)");
ABSL_FLAG(std::string, server_bin, "", "ps_server binary (default: next to this one in runfiles)");
ABSL_FLAG(std::string, data_transport, "tcp",
          "data plane of the workers: tcp (the server's TCP data port over loopback, standing in "
          "for a network), unix (its Unix socket: server and worker on one host), grpc or auto");
ABSL_FLAG(std::string, server_flags, "", "extra ps_server flags, space separated (experiments)");
ABSL_FLAG(int, data_spin_us, 50, "workers: spin before sleeping on the TCP data plane, microseconds");
ABSL_FLAG(int, data_shm_mib, 16,
          "workers over the Unix socket: shared-memory rings of this many MiB (0 = none)");
ABSL_FLAG(int, repeats, 1, "measure every row this many times, interleaved; medians are shown");
ABSL_FLAG(bool, skip_two_workers, false, "measure only the 1 x 1 cluster");
ABSL_FLAG(bool, two_servers, false,
          "also measure 2 servers x 1 worker (BSP): the model's blocks over two server processes, "
          "without and with replication 2 (each block also kept on the other server), and with "
          "the busiest virtual shard moved live from one server to the other again and again");
ABSL_FLAG(std::string, transport, "float32",
          "wire type of every table's pulls and pushes: float32, float16 or bfloat16");

namespace pscluster {
namespace {

using worker::TrainerResult;

v1::JobSpec Spec(v1::ConsistencySpec::Mode mode = v1::ConsistencySpec::BSP) {
  v1::JobSpec spec;
  spec.set_name("bench");
  spec.mutable_model()->set_kind("mlp");
  for (absl::string_view h : absl::StrSplit(absl::GetFlag(FLAGS_hidden), ',', absl::SkipEmpty())) {
    spec.mutable_model()->add_hidden(std::stoi(std::string(h)));
  }
  spec.mutable_dataset()->set_name("fashion_mnist");
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
  spec.mutable_optimizer()->set_learning_rate(1e-3f);
  spec.mutable_consistency()->set_mode(mode);
  if (mode == v1::ConsistencySpec::SSP) spec.mutable_consistency()->set_staleness(1);
  spec.set_epochs(absl::GetFlag(FLAGS_epochs));
  spec.set_batch_size(absl::GetFlag(FLAGS_batch));
  spec.set_device("cpu");
  spec.set_seed(1);
  std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport != "float32") {
    v1::CompressionSpec c;
    c.set_transport(transport == "bfloat16" ? v1::DT_BFLOAT16 : v1::DT_FLOAT16);
    int layers = spec.model().hidden_size();
    for (int l = 1; l <= layers + 1; ++l) {
      std::string layer = l <= layers ? absl::StrCat("fc", l) : "out";
      (*spec.mutable_table_compression())[layer + "/weight"] = c;
      (*spec.mutable_table_compression())[layer + "/bias"] = c;
    }
  }
  return spec;
}

struct Row {
  std::string name;
  double samples_per_sec = 0;
  double pull = 0, compute = 0, push = 0;  // Seconds per step.
  double accuracy = -1;
  // The server's data-plane phases per step (server/data_stream.h), for the cluster rows.
  v1::DataPlaneTimes server;
  double plan = 0, send = 0, wait = 0, copy = 0;  // The workers' PsClient, seconds per step.
  // CPU over the training window: cores busy on the whole machine, and CPU-seconds per 1,000
  // samples of the machine, of this process (the workers, or the single process) and of the
  // servers.
  double cores = 0, cpu = 0, cpu_self = 0, cpu_servers = 0;
};

// Fills the CPU columns of `row` from `samples` trained between `from` and `to`.
void SetCpu(bench::CpuSampler& sampler, absl::Time from, absl::Time to, int64_t samples,
            Row* row) {
  bench::CpuSampler::Usage u = sampler.Between(from, to);
  const double k = 1e6 / std::max<int64_t>(1, samples);  // CPU-ms per 1,000 samples.
  row->cores = u.cores_busy();
  row->cpu = u.machine_busy_sec * k;
  row->cpu_self = u.process_sec.empty() ? 0 : u.process_sec[0] * k;
  double servers = 0;
  for (size_t i = 1; i < u.process_sec.size(); ++i) servers += u.process_sec[i];
  row->cpu_servers = servers * k;
}

// The server's cumulative data-plane phase times (zeros when the Status call fails).
v1::DataPlaneTimes ServerTimes(const std::string& address) {
  auto channel = MakeChannel(address);
  if (!channel.ok()) return {};
  auto stub = v1::ParameterServer::NewStub(*channel);
  v1::ServerStatusRequest req;
  v1::ServerStatus st;
  auto ctx = CallContext(absl::Seconds(5));
  if (!stub->Status(ctx.get(), req, &st).ok()) return {};
  return st.times();
}

// The model trained in this process: batch -> TrainStep -> Adam on host buffers.
absl::StatusOr<Row> SingleProcess(const data::FashionMnist& fm, bench::CpuSampler& sampler) {
  auto r = bench::TrainInOneProcess(Spec(), fm, absl::GetFlag(FLAGS_cpu_threads));
  if (!r.ok()) return r.status();
  Row row;
  row.name = "single process (no PS)";
  row.samples_per_sec = r->samples_per_sec;
  SetCpu(sampler, r->start, r->end, r->samples, &row);
  row.compute = r->compute_sec_per_step;
  row.accuracy = r->test_accuracy;
  return row;
}

// Moves the busiest virtual shard from one server to the other, again and again, while the job
// trains: what the scheduler's MoveShard does (scheduler/shard_move.cc), with the two servers'
// gRPC calls made here. It is also the workers' source of newer maps.
class ShardMover final : public worker::ProgressSink {
 public:
  ShardMover(v1::ShardMap map) : map_(std::move(map)) {
    for (const auto& ep : map_.servers()) {
      auto channel = MakeChannel(ep.address());
      if (channel.ok()) stubs_[ep.node_id()] = v1::ParameterServer::NewStub(*channel);
    }
  }
  bool Report(const v1::WorkerProgress&) override { return true; }
  absl::StatusOr<v1::ShardMap> RefreshShardMap() override {
    absl::MutexLock l(&mu_);
    return map_;
  }
  // Moves shards until `stop`; returns the first failure (moves done meanwhile are counted).
  absl::Status Run(const std::atomic<bool>& stop) {
    while (!stop.load()) {
      absl::Status s = MoveOnce(stop);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  int moves() const { return moves_; }
  double copy_ms() const { return moves_ ? copy_ms_ / moves_ : 0; }
  double switch_ms() const { return moves_ ? switch_ms_ / moves_ : 0; }

 private:
  absl::Status Update(const std::string& node, v1::UpdateShardMapRequest req) {
    req.set_self(node);
    v1::UpdateShardMapResponse resp;
    auto ctx = CallContext(absl::Seconds(10));
    grpc::Status st = stubs_[node]->UpdateShardMap(ctx.get(), req, &resp);
    if (!st.ok()) return absl::UnavailableError(absl::StrCat(node, ": ", st.error_message()));
    return absl::OkStatus();
  }
  absl::StatusOr<v1::ServerStatus> Status(const std::string& node) {
    v1::ServerStatusRequest req;
    req.set_job_id(map_.job_id());
    v1::ServerStatus st;
    auto ctx = CallContext(absl::Seconds(10));
    grpc::Status s = stubs_[node]->Status(ctx.get(), req, &st);
    if (!s.ok()) return absl::UnavailableError(s.error_message());
    return st;
  }
  void Publish(const v1::ShardMap& m) {
    absl::MutexLock l(&mu_);
    map_ = m;
  }
  absl::Status MoveOnce(const std::atomic<bool>& stop) {
    v1::ShardMap map = *RefreshShardMap();
    // The busiest shard of the last window, on either server.
    uint32_t shard = 0;
    double hottest = -1;
    for (const auto& ep : map.servers()) {
      auto st = Status(ep.node_id());
      if (!st.ok() || st->jobs_size() == 0) {  // The job's tables are not created yet.
        absl::SleepFor(absl::Milliseconds(50));
        return absl::OkStatus();
      }
      for (const auto& l : st->shard_loads()) {
        if (l.load().bytes_per_sec() > hottest) {
          hottest = l.load().bytes_per_sec();
          shard = l.shard();
        }
      }
    }
    if (hottest <= 0) {  // No load measured yet.
      absl::SleepFor(absl::Milliseconds(50));
      return absl::OkStatus();
    }
    const std::string from = map.assignments(shard).primary();
    const std::string to = map.servers(0).node_id() == from ? map.servers(1).node_id()
                                                          : map.servers(0).node_id();
    const absl::Time t0 = absl::Now();
    v1::ShardMap copying = map;
    copying.set_epoch(map.epoch() + 1);
    copying.mutable_assignments(shard)->add_backups(to);
    Publish(copying);
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = copying;
    v1::ReplicaSeed* seed = req.add_copy_from();
    seed->set_primary(from);
    seed->set_live(true);
    absl::Status s = Update(to, req);
    req.clear_copy_from();
    req.set_seed_new_backups(true);
    if (s.ok()) s = Update(from, req);
    while (s.ok()) {
      auto st = Status(to);
      if (!st.ok()) return st.status();
      bool caught_up = false;
      for (const auto& r : st->jobs(0).replicas()) caught_up = caught_up || r.caught_up();
      if (caught_up) break;
      if (stop.load() || absl::Now() - t0 > absl::Seconds(30)) {
        s = absl::DeadlineExceededError("the copy did not catch up");
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    const absl::Time t1 = absl::Now();
    v1::ShardMap next = copying;
    next.set_epoch(copying.epoch() + 1);
    next.mutable_assignments(shard)->clear_backups();
    if (s.ok()) next.mutable_assignments(shard)->set_primary(to);
    Publish(next);
    v1::UpdateShardMapRequest sw;
    *sw.mutable_map() = next;
    absl::Status first = Update(from, sw);
    absl::Status second = Update(to, sw);
    if (!s.ok() && !stop.load()) return s;
    if (!first.ok() || !second.ok()) return first.ok() ? second : first;
    if (s.ok()) {
      ++moves_;
      copy_ms_ += absl::ToDoubleMilliseconds(t1 - t0);
      switch_ms_ += absl::ToDoubleMilliseconds(absl::Now() - t1);
    }
    return absl::OkStatus();
  }

  absl::Mutex mu_;
  v1::ShardMap map_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<v1::ParameterServer::Stub>> stubs_;
  int moves_ = 0;
  double copy_ms_ = 0, switch_ms_ = 0;
};

// The servers' data-plane phase times, summed.
v1::DataPlaneTimes ServerTimes(const std::vector<std::string>& addresses) {
  v1::DataPlaneTimes sum;
  for (const auto& a : addresses) {
    v1::DataPlaneTimes t = ServerTimes(a);
    sum.set_parse_sec(sum.parse_sec() + t.parse_sec());
    sum.set_queue_sec(sum.queue_sec() + t.queue_sec());
    sum.set_apply_sec(sum.apply_sec() + t.apply_sec());
    sum.set_read_sec(sum.read_sec() + t.read_sec());
    sum.set_park_sec(sum.park_sec() + t.park_sec());
  }
  return sum;
}

absl::StatusOr<Row> Cluster(const std::vector<std::string>& server_addresses, int workers,
                            int run, v1::ConsistencySpec::Mode mode, int replication,
                            bench::CpuSampler& sampler, bool moving = false) {
  std::vector<std::unique_ptr<worker::Trainer>> trainers;
  std::unique_ptr<ShardMover> sink;
  worker::TrainerOptions to;
  to.device = "cpu";
  to.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  to.install_shard_map = true;
  to.eval_every_epoch = false;
  auto transport = ParseDataTransport(absl::GetFlag(FLAGS_data_transport));
  if (!transport.ok()) return transport.status();
  to.data_transport = *transport;
  to.data_spin = absl::Microseconds(absl::GetFlag(FLAGS_data_spin_us));
  to.data_shm_ring_bytes = static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_data_shm_mib)))
                           << 20;
  for (int r = 0; r < workers; ++r) {
    v1::AssignTaskRequest task;
    task.set_job_id(absl::StrCat("bench-", server_addresses.size(), "s-", workers, "x-", run));
    *task.mutable_spec() = Spec(mode);
    task.mutable_spec()->set_num_workers(workers);
    task.set_rank(r);
    task.set_num_workers(workers);
    task.set_job_id(absl::StrCat(task.job_id(), "-r", replication));
    if (moving) task.set_job_id(absl::StrCat(task.job_id(), "-moving"));
    auto map = worker::RoundRobinShardMap(task.job_id(), server_addresses, 64);
    if (!map.ok()) return map.status();
    for (auto& a : *map->mutable_assignments()) {
      // Backups on the next servers (the scheduler's placement does the same).
      for (int k = 1; k < replication; ++k) {
        a.add_backups(absl::StrCat("server-", (a.shard() + k) % server_addresses.size()));
      }
    }
    *task.mutable_shard_map() = *map;
    if (sink == nullptr) sink = std::make_unique<ShardMover>(*map);
    auto t = worker::Trainer::Create(task, to, sink.get());
    if (!t.ok()) return t.status();
    trainers.push_back(std::move(*t));
  }
  const v1::DataPlaneTimes before = ServerTimes(server_addresses);
  std::vector<absl::Status> st(workers);
  std::vector<std::thread> threads;
  std::atomic<bool> trained{false};
  absl::Status moved;
  std::thread mover;
  if (moving) {
    mover = std::thread([&] {
      absl::SleepFor(absl::Milliseconds(300));  // Let the servers measure some load first.
      moved = sink->Run(trained);
    });
  }
  for (int r = 1; r < workers; ++r) threads.emplace_back([&, r] { st[r] = trainers[r]->Run(); });
  st[0] = trainers[0]->Run();
  for (auto& t : threads) t.join();
  trained = true;
  if (mover.joinable()) mover.join();
  if (!moved.ok()) return moved;
  Row row;
  row.name = absl::StrCat(server_addresses.size(), server_addresses.size() > 1 ? " servers" : " server",
                          " x ", workers, " worker", workers > 1 ? "s" : "",
                          mode == v1::ConsistencySpec::BSP ? " (BSP" : " (SSP s=1, prefetch",
                          replication > 1 ? absl::StrCat(", replication ", replication, ")") : ")");
  if (moving) {
    row.name = absl::StrCat(row.name, ", moving shards: ", sink->moves(), " moves, copy ",
                            absl::StrFormat("%.0f", sink->copy_ms()), " ms + switch ",
                            absl::StrFormat("%.1f", sink->switch_ms()), " ms each");
  }
  int64_t steps = 0, samples = 0;
  absl::Time from = absl::InfiniteFuture(), until = absl::InfinitePast();
  for (int r = 0; r < workers; ++r) {
    if (!st[r].ok()) return st[r];
    TrainerResult res = trainers[r]->result();
    samples += static_cast<int64_t>(res.samples_per_sec * res.train_sec + 0.5);
    from = std::min(from, res.train_start);
    until = std::max(until, res.train_end);
    row.samples_per_sec += res.samples_per_sec;
    steps += res.steps;
    row.pull += res.pull_wait_sec;
    row.compute += res.compute_sec;
    row.push += res.push_wait_sec;
    row.plan += res.client_plan_sec;
    row.send += res.client_send_sec;
    row.wait += res.client_wait_sec;
    row.copy += res.client_copy_sec;
  }
  const v1::DataPlaneTimes after = ServerTimes(server_addresses);
  row.server.set_parse_sec((after.parse_sec() - before.parse_sec()) / steps);
  row.server.set_queue_sec((after.queue_sec() - before.queue_sec()) / steps);
  row.server.set_apply_sec((after.apply_sec() - before.apply_sec()) / steps);
  row.server.set_read_sec((after.read_sec() - before.read_sec()) / steps);
  row.server.set_park_sec((after.park_sec() - before.park_sec()) / steps);
  row.pull /= steps;
  row.plan /= steps;
  row.send /= steps;
  row.wait /= steps;
  row.copy /= steps;
  row.compute /= steps;
  row.push /= steps;
  row.accuracy = trainers[0]->result().test_accuracy;
  SetCpu(sampler, from, until, samples, &row);
  return row;
}

std::string DefaultServerBin(const char* argv0) {
  const char* srcdir = std::getenv("RUNFILES_DIR");
  std::string base = srcdir ? std::string(srcdir) : std::string(argv0) + ".runfiles";
  return base + "/pscluster/server/ps_server";
}

int Main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  pscluster::DisableMutexDeadlockDetection();
  (void)rest;
  SetLogLevel("warn").IgnoreError();
  auto fm = data::LoadFashionMnist("");
  if (!fm.ok()) {
    std::fprintf(stderr, "%s\n", fm.status().ToString().c_str());
    return 1;
  }
  std::string server_bin = absl::GetFlag(FLAGS_server_bin);
  if (server_bin.empty()) server_bin = DefaultServerBin(argv[0]);
  char tmpl[] = "/tmp/training_bench.XXXXXX";
  std::string dir = mkdtemp(tmpl);
  // Starts ps_server number `i`; its address, or "" (reported) when it did not start.
  std::vector<std::unique_ptr<psctl::Subprocess>> servers;
  auto start_server = [&](int i) -> std::string {
    psctl::SpawnOptions so;
    so.binary = server_bin;
    const std::string port_file = absl::StrCat(dir, "/port", i);
    so.args = {"--listen=127.0.0.1:0", "--port_file=" + port_file, "--log_level=warn"};
    for (absl::string_view f :
         absl::StrSplit(absl::GetFlag(FLAGS_server_flags), ' ', absl::SkipEmpty())) {
      so.args.emplace_back(f);
    }
    so.log_file = absl::StrCat(dir, "/server", i, ".log");
    auto server = psctl::Subprocess::Spawn(so);
    if (!server.ok()) {
      std::fprintf(stderr, "--server_bin: %s\n", server.status().ToString().c_str());
      return "";
    }
    servers.push_back(std::move(*server));
    std::string address;
    for (int k = 0; k < 200 && address.empty(); ++k) {
      auto text = ReadFile(port_file);
      if (text.ok() && !text->empty()) address = std::string(absl::StripAsciiWhitespace(*text));
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (address.empty()) {
      std::fprintf(stderr, "ps_server did not start (log: %s)\n", so.log_file.c_str());
    }
    return address;
  };
  const std::string address = start_server(0);
  if (address.empty()) return 1;
  std::string second;
  if (absl::GetFlag(FLAGS_two_servers)) {
    second = start_server(1);
    if (second.empty()) return 1;
  }

  std::printf(
      "MLP %s on Fashion-MNIST, batch %d, %d epoch(s) per run, CPU backend, %u cores, %s "
      "transport\n",
      absl::GetFlag(FLAGS_hidden).c_str(), absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_epochs),
      std::thread::hardware_concurrency(), absl::GetFlag(FLAGS_transport).c_str());
  // Each repeat measures every row once, one after the other, so a slow spell of the machine
  // hits the baseline and the cluster alike; the table shows medians over the repeats.
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  struct Config {
    std::vector<std::string> servers;
    int workers;
    v1::ConsistencySpec::Mode mode;
    int replication = 1;
    bool moving = false;
  };
  std::vector<Config> configs = {{{address}, 1, v1::ConsistencySpec::BSP},
                                 {{address}, 1, v1::ConsistencySpec::SSP}};
  if (!absl::GetFlag(FLAGS_skip_two_workers)) {
    configs.push_back({{address}, 2, v1::ConsistencySpec::BSP});
  }
  if (!second.empty()) {
    configs.push_back({{address, second}, 1, v1::ConsistencySpec::BSP});
    configs.push_back({{address, second}, 1, v1::ConsistencySpec::BSP, 2});
    configs.push_back({{address, second}, 1, v1::ConsistencySpec::BSP, 1, true});
  }
  std::vector<pid_t> watched = {0};  // This process, then the servers.
  for (const auto& server : servers) watched.push_back(server->pid());
  bench::CpuSampler sampler(watched);
  std::vector<std::vector<Row>> runs(configs.size() + 1);
  std::vector<std::vector<double>> ratios(configs.size() + 1);
  int run = 0;
  for (int rep = 0; rep < repeats; ++rep) {
    std::fprintf(stderr, "repeat %d/%d: training in one process...\n", rep + 1, repeats);
    auto single = SingleProcess(*fm, sampler);
    if (!single.ok()) {
      std::fprintf(stderr, "single process: %s\n", single.status().ToString().c_str());
      return 1;
    }
    runs[0].push_back(*single);
    ratios[0].push_back(1.0);
    for (size_t c = 0; c < configs.size(); ++c) {
      const Config& config = configs[c];
      const int workers = config.workers;
      std::fprintf(stderr, "repeat %d/%d: training through %zu server(s) with %d worker(s)...\n",
                   rep + 1, repeats, config.servers.size(), workers);
      auto row = Cluster(config.servers, workers, run++, config.mode, config.replication,
                         sampler, config.moving);
      if (!row.ok()) {
        std::fprintf(stderr, "%d workers: %s\n", workers, row.status().ToString().c_str());
        return 1;
      }
      runs[c + 1].push_back(*row);
      ratios[c + 1].push_back(row->samples_per_sec / single->samples_per_sec);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  auto med = [&](const std::vector<Row>& rs, auto field) {
    std::vector<double> v;
    for (const Row& r : rs) v.push_back(field(r));
    return median(v);
  };
  std::printf("\nMedians over %d repeat(s); the ratio is the median of each repeat's ratio.\n",
              repeats);
  std::printf("\n| run | samples/s | ratio to single process | pull wait ms/step | compute ms/step | push wait ms/step | test acc |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (size_t c = 0; c < runs.size(); ++c) {
    const auto& rs = runs[c];
    std::printf("| %s | %.0f | %.2f | %.2f | %.2f | %.2f | %.4f |\n", rs[0].name.c_str(),
                med(rs, [](const Row& r) { return r.samples_per_sec; }), median(ratios[c]),
                med(rs, [](const Row& r) { return r.pull; }) * 1e3,
                med(rs, [](const Row& r) { return r.compute; }) * 1e3,
                med(rs, [](const Row& r) { return r.push; }) * 1e3,
                med(rs, [](const Row& r) { return r.accuracy; }));
  }
  if (repeats > 1) {
    std::printf("\nEach repeat's ratio:\n\n");
    for (size_t c = 1; c < runs.size(); ++c) {
      std::vector<std::string> text;
      for (double r : ratios[c]) text.push_back(absl::StrFormat("%.2f", r));
      std::printf("- %s: %s\n", runs[c][0].name.c_str(), absl::StrJoin(text, ", ").c_str());
    }
  }
  std::printf(
      "\nWhere the data plane's time goes, ms per worker step (worker: its client's calls; "
      "server: summed over its threads):\n\n"
      "| run | worker plan | worker send | worker wait | worker reply copy | server parse | "
      "server queue (summed over chunks) | server apply (decode + optimizer) | server read (copy "
      "into replies) | server parked |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t c = 1; c < runs.size(); ++c) {
    const auto& rs = runs[c];
    std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n",
                rs[0].name.c_str(), med(rs, [](const Row& r) { return r.plan; }) * 1e3,
                med(rs, [](const Row& r) { return r.send; }) * 1e3,
                med(rs, [](const Row& r) { return r.wait; }) * 1e3,
                med(rs, [](const Row& r) { return r.copy; }) * 1e3,
                med(rs, [](const Row& r) { return r.server.parse_sec(); }) * 1e3,
                med(rs, [](const Row& r) { return r.server.queue_sec(); }) * 1e3,
                med(rs, [](const Row& r) { return r.server.apply_sec(); }) * 1e3,
                med(rs, [](const Row& r) { return r.server.read_sec(); }) * 1e3,
                med(rs, [](const Row& r) { return r.server.park_sec(); }) * 1e3);
  }
  const double single_cpu = med(runs[0], [](const Row& r) { return r.cpu; });
  std::printf(
      "\nCPU over the training window (evaluation excluded): cores busy on the whole machine "
      "(of %u), and CPU ms per 1,000 samples of the machine, of the process that trains (the "
      "workers, or the single process) and of the server(s). The last column is the ratio the "
      "row would reach with as many cores busy as the single process: its CPU per sample "
      "against the single process'.\n\n"
      "| run | cores busy | CPU ms / 1k samples (machine) | training process | server(s) | rest "
      "| single process' CPU per sample / this row's |\n|---|---|---|---|---|---|---|\n",
      std::thread::hardware_concurrency());
  for (size_t c = 0; c < runs.size(); ++c) {
    const auto& rs = runs[c];
    const double cpu = med(rs, [](const Row& r) { return r.cpu; });
    const double self = med(rs, [](const Row& r) { return r.cpu_self; });
    const double srv = med(rs, [](const Row& r) { return r.cpu_servers; });
    std::printf("| %s | %.2f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", rs[0].name.c_str(),
                med(rs, [](const Row& r) { return r.cores; }), cpu, self, srv,
                std::max(0.0, cpu - self - srv), cpu > 0 ? single_cpu / cpu : 0);
  }
  for (size_t c = 0; c < configs.size(); ++c) {
    if (configs[c].workers == 2 && configs[c].servers.size() == 1) {
      std::printf("\n2 workers / 1 worker (BSP): %.2f\n",
                  med(runs[c + 1], [](const Row& r) { return r.samples_per_sec; }) /
                      med(runs[1], [](const Row& r) { return r.samples_per_sec; }));
    }
  }
  for (auto& server : servers) server->Terminate(absl::Seconds(5));
  return 0;
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) { return pscluster::Main(argc, argv); }
