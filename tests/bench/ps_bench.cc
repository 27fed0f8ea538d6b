// Parameter-server data-plane benchmark. In one run, on loopback:
//  * dense push, pull and push-pull (1 server x 1 client, then 2 servers x 2 clients) for 4 KiB
//    .. 64 MiB tensors, median of >= 5 runs, GB/s and per-round latency;
//  * sparse rows/s (1k-row requests, width 64, Zipf keys over a 10^7-row table) beside the
//    in-process table's own rows/s;
//  * optimizer apply GB/s (Adam, float32);
// each beside baselines measured in the same run (raw TCP echo, bare gRPC bidi-stream echo,
// memcpy) with the ratios, and a profile of where a round's time goes.
//
//   bazel run -c opt //tests/bench:ps_bench -- [--runs=5] [--quick] [--out=FILE]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/barrier.h"
#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "server/client/ps_client.h"
#include "server/optimizer.h"
#include "server/payload.h"
#include "server/table.h"
#include "server/wire.h"
#include "common/sharding.h"
#include "tests/bench/apply_bench.h"
#include "tests/bench/cpu_usage.h"
#include "tests/bench/ps_bench_baselines.h"
#include "tests/bench/ps_bench_process.h"

ABSL_FLAG(std::string, serve, "", "internal: run an echo server (tcp or grpc)");
ABSL_FLAG(std::string, port_file, "", "internal: port file of --serve");
ABSL_FLAG(std::string, server_binary, "", "ps_server to launch (default: from the runfiles)");
ABSL_FLAG(int, runs, 5, "runs per measurement (the median is reported)");
ABSL_FLAG(bool, quick, false, "fewer rounds per run (a smoke test, not for the record)");
ABSL_FLAG(std::string, sizes, "4096,262144,4194304,67108864", "dense payload sizes in bytes");
ABSL_FLAG(std::string, out, "", "also write the report (markdown) to this file");
ABSL_FLAG(std::string, echo_grpc_args, "",
          "gRPC integer channel args for the gRPC echo baseline, name=value;... (experiments)");
ABSL_FLAG(std::string, ps_grpc_args, "",
          "gRPC channel args for ps_server and the clients, name=value;... (experiments)");
ABSL_FLAG(std::string, ps_server_flags, "", "extra ps_server flags, space separated (experiments)");
ABSL_FLAG(int64_t, copy_below_bytes, -1, "client: copy push payloads up to this size (experiments)");
ABSL_FLAG(int, block_kib, 0, "dense block size in KiB (0 = tensor/8, 256 KiB .. 4 MiB)");
ABSL_FLAG(bool, only_1x1, false, "stop after the 1 server x 1 client table (experiments)");
ABSL_FLAG(std::string, transport, "tcp",
          "data plane of the ps clients: tcp (the server's TCP data port), grpc (PushPull), unix "
          "(its Unix socket) or auto");
ABSL_FLAG(int, spin_us, 50, "TCP data plane: client spin before sleeping, microseconds");
ABSL_FLAG(int, shm_mib, 16,
          "--transport=unix: shared-memory rings of this many MiB (0 = payloads over the socket)");
ABSL_FLAG(int, sparse_threads, 4, "client threads (requests in flight) for the sparse benchmark");

namespace pscluster {
namespace bench {
namespace {

std::string self_path;
// The whole machine's CPU use, for the scaling table (set by Main).
CpuSampler* g_cpu = nullptr;

std::vector<std::pair<std::string, int>> EchoGrpcArgs() {
  std::vector<std::pair<std::string, int>> out;
  for (auto kv : absl::StrSplit(absl::GetFlag(FLAGS_echo_grpc_args), ';', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, '=');
    int v = 0;
    if (absl::SimpleAtoi(p.second, &v)) out.emplace_back(p.first, v);
  }
  return out;
}

void Progress(const std::string& s) {
  fprintf(stderr, "[ps_bench] %s\n", s.c_str());
  fflush(stderr);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string Size(size_t b) {
  if (b >= (1 << 20)) return absl::StrCat(b >> 20, " MiB");
  return absl::StrCat(b >> 10, " KiB");
}
std::string Gbs(double bytes_per_sec) { return absl::StrFormat("%.2f", bytes_per_sec / 1e9); }
std::string Us(double sec) {
  return sec < 1e-2 ? absl::StrFormat("%.0f µs", sec * 1e6) : absl::StrFormat("%.1f ms", sec * 1e3);
}

int RoundsFor(size_t bytes) {
  int r = static_cast<int>(std::clamp<size_t>((256u << 20) / bytes, 4, 400));
  if (absl::GetFlag(FLAGS_quick)) r = std::max(2, r / 10);
  return r;
}

// Blocks of at most 4 MiB, at least 8 per tensor where it is large enough (so a tensor
// spreads over servers and chunks pipeline).
uint64_t BlockElemsFor(uint64_t elems) {
  if (absl::GetFlag(FLAGS_block_kib) > 0) return absl::GetFlag(FLAGS_block_kib) * 256;
  return std::clamp<uint64_t>(elems / 8, kDefaultBlockElems, 1 << 20);
}

v1::ShardMap MapOf(const std::string& job, const std::vector<std::string>& addrs) {
  v1::ShardMap m;
  m.set_job_id(job);
  m.set_epoch(1);
  m.set_num_virtual_shards(64);
  for (uint32_t s = 0; s < 64; ++s) {
    auto* a = m.add_assignments();
    a->set_shard(s);
    a->set_primary(absl::StrCat("s", s % addrs.size()));
  }
  for (size_t i = 0; i < addrs.size(); ++i) {
    auto* e = m.add_servers();
    e->set_node_id(absl::StrCat("s", i));
    e->set_address(addrs[i]);
  }
  return m;
}

v1::OptimizerSpec Opt(v1::OptimizerSpec::Kind k, float lr) {
  v1::OptimizerSpec o;
  o.set_kind(k);
  o.set_learning_rate(lr);
  return o;
}

std::unique_ptr<PsClient> MakeClient(const std::string& job, const std::vector<std::string>& addrs,
                                     const std::vector<v1::TableSpec>& tables, uint32_t rank,
                                     uint32_t workers) {
  PsClientOptions o;
  o.job_id = job;
  o.worker = rank;
  o.call_timeout = absl::Seconds(120);
  auto transport = ParseDataTransport(absl::GetFlag(FLAGS_transport));
  if (!transport.ok()) {
    Progress(absl::StrCat("--transport: ", transport.status().message()));
    exit(2);
  }
  o.data_transport = *transport;
  o.spin = absl::Microseconds(absl::GetFlag(FLAGS_spin_us));
  o.shm_ring_bytes = static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_shm_mib))) << 20;
  o.channel.int_args = *DataPlaneChannelArgs(absl::GetFlag(FLAGS_ps_grpc_args));
  if (absl::GetFlag(FLAGS_copy_below_bytes) >= 0) {
    o.copy_below_bytes = absl::GetFlag(FLAGS_copy_below_bytes);
  }
  auto c = PsClient::Create(o, MapOf(job, addrs), tables);
  if (!c.ok()) {
    Progress(absl::StrCat("client: ", c.status().ToString()));
    exit(1);
  }
  if (rank == 0) {
    absl::Status st = (*c)->InstallShardMap();
    v1::ConsistencySpec asp;
    asp.set_mode(v1::ConsistencySpec::ASP);
    if (st.ok()) st = (*c)->CreateTables(asp, workers);
    if (!st.ok()) {
      Progress(absl::StrCat("setup: ", st.ToString()));
      exit(1);
    }
  }
  return std::move(*c);
}

void Check(const absl::Status& st, const char* what) {
  if (!st.ok()) {
    Progress(absl::StrCat(what, ": ", st.ToString()));
    exit(1);
  }
}

// ------------------------------------------------------------------ dense

// Seconds per round of each measurement, one value per run. Baselines and ps calls are
// interleaved run by run, so that a ratio compares measurements taken moments apart (the
// machine is shared; its load drifts).
struct DenseResult {
  std::vector<double> tcp, grpc, push, pull, pushpull;
  std::vector<double> one_pushpull;  // With `ref_1x1`: 1 client on the first server alone.
  // With `ref_1x1` and a TCP echo address: one echo connection, and two at once (per round).
  std::vector<double> tcp_one, tcp_two;
  // With `ref_1x1`: cores busy on the whole machine during each of those four measurements.
  std::vector<double> cores_tcp_one, cores_tcp_two, cores_one, cores_pushpull;
  PsClient::Stats client;     // Client 0, push-pull phases only.
  v1::DataPlaneTimes server;  // Summed over servers, push-pull phases only.
  int pushpull_rounds = 0;
};

double Med(const std::vector<double>& v) { return v.empty() ? 0 : Median(v); }
// Median over runs of a[i] / b[i].
double MedRatio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) r.push_back(a[i] / b[i]);
  return Med(r);
}

v1::DataPlaneTimes ServerTimes(PsClient* c) {
  v1::DataPlaneTimes t;
  auto st = c->ServerStatuses();
  if (!st.ok()) return t;
  for (const auto& s : *st) {
    t.set_parse_sec(t.parse_sec() + s.times().parse_sec());
    t.set_queue_sec(t.queue_sec() + s.times().queue_sec());
    t.set_apply_sec(t.apply_sec() + s.times().apply_sec());
    t.set_read_sec(t.read_sec() + s.times().read_sec());
    t.set_chunks_in(t.chunks_in() + s.times().chunks_in());
    t.set_copies_on_write(t.copies_on_write() + s.times().copies_on_write());
  }
  return t;
}

void AddDelta(const v1::DataPlaneTimes& a, const v1::DataPlaneTimes& b, v1::DataPlaneTimes* sum) {
  sum->set_parse_sec(sum->parse_sec() + b.parse_sec() - a.parse_sec());
  sum->set_queue_sec(sum->queue_sec() + b.queue_sec() - a.queue_sec());
  sum->set_apply_sec(sum->apply_sec() + b.apply_sec() - a.apply_sec());
  sum->set_read_sec(sum->read_sec() + b.read_sec() - a.read_sec());
  sum->set_chunks_in(sum->chunks_in() + b.chunks_in() - a.chunks_in());
  sum->set_copies_on_write(sum->copies_on_write() + b.copies_on_write() - a.copies_on_write());
}

// `echo` (1x1 only): also measures the TCP and gRPC echo baselines, interleaved.
// `ref_1x1`: also measures push-pull by one client of the first server alone (its own job),
// interleaved, so that the scaling ratio compares runs taken moments apart; with `tcp_addr`,
// also the raw TCP echo over one connection and over two at once (the same scaling, for bare
// TCP on this machine).
DenseResult BenchDense(const std::vector<std::string>& addrs, int clients, size_t bytes,
                       const std::string& tcp_addr, const std::string& grpc_addr, bool echo,
                       bool ref_1x1 = false) {
  static int job_seq = 0;
  const std::string job = absl::StrCat("dense", job_seq++);
  const uint64_t elems = bytes / 4;
  v1::TableSpec t;
  t.set_name("t");
  t.set_kind(v1::DENSE);
  t.mutable_shape()->add_dims(elems);
  t.set_block_elems(BlockElemsFor(elems));
  *t.mutable_optimizer() = Opt(v1::OptimizerSpec::SGD, 1e-6f);
  std::vector<std::unique_ptr<PsClient>> cs;
  for (int i = 0; i < clients; ++i) cs.push_back(MakeClient(job, addrs, {t}, i, clients));
  std::unique_ptr<PsClient> ref;
  if (ref_1x1) ref = MakeClient(job + "-1x1", {addrs[0]}, {t}, 0, 1);
  std::unique_ptr<EchoClient> tcp, grpc;
  std::vector<std::unique_ptr<EchoClient>> scaling_echo;
  if (ref_1x1 && !tcp_addr.empty()) {
    for (int i = 0; i < 3; ++i) {
      auto tc = ConnectTcpEcho(tcp_addr);
      Check(tc.status(), "tcp echo");
      scaling_echo.push_back(std::move(*tc));
    }
  }
  if (echo) {
    auto tc = ConnectTcpEcho(tcp_addr);
    auto gc = ConnectGrpcEcho(grpc_addr, 4 << 20, EchoGrpcArgs());
    Check(tc.status(), "tcp echo");
    Check(gc.status(), "grpc echo");
    tcp = std::move(*tc);
    grpc = std::move(*gc);
  }
  std::vector<std::vector<float>> grads(clients, std::vector<float>(elems, 1e-3f));
  std::vector<std::vector<float>> vals(clients, std::vector<float>(elems, 0.f));
  std::vector<int64_t> step(clients, 0);
  const int rounds = RoundsFor(bytes);
  auto ps_rounds = [&](int mode) {  // 0 push, 1 pull, 2 push-pull; seconds per round.
    absl::Barrier* start = new absl::Barrier(clients + 1);
    std::vector<std::thread> th;
    for (int c = 0; c < clients; ++c) {
      th.emplace_back([&, c] {
        if (start->Block()) delete start;
        PushSources src{{{"t", grads[c].data()}}, {}};
        PullTargets dst{{{"t", vals[c].data()}}, {}};
        for (int r = 0; r < rounds; ++r) {
          if (mode == 0) Check(cs[c]->Push(step[c]++, src), "push");
          if (mode == 1) Check(cs[c]->Pull(step[c], dst), "pull");
          if (mode == 2) Check(cs[c]->PushPull(step[c]++, src, dst), "push-pull");
        }
      });
    }
    absl::Time t0 = absl::Now();
    if (start->Block()) delete start;
    for (auto& x : th) x.join();
    return absl::ToDoubleSeconds(absl::Now() - t0) / rounds;
  };
  std::vector<float> ref_vals(ref ? elems : 0);
  int64_t ref_step = 0;
  auto ref_rounds = [&] {
    PushSources src{{{"t", grads[0].data()}}, {}};
    PullTargets dst{{{"t", ref_vals.data()}}, {}};
    absl::Time t0 = absl::Now();
    for (int r = 0; r < rounds; ++r) Check(ref->PushPull(ref_step++, src, dst), "push-pull 1x1");
    return absl::ToDoubleSeconds(absl::Now() - t0) / rounds;
  };
  auto echo_rounds = [&](EchoClient* e) {
    double total = 0;
    for (int i = 0; i < rounds; ++i) {
      auto s = e->Round(bytes);
      Check(s.status(), "echo round");
      total += *s;
    }
    return total / rounds;
  };
  auto echo_two = [&] {  // Two connections at once; seconds per round of each.
    absl::Time t0 = absl::Now();
    std::thread other([&] { echo_rounds(scaling_echo[2].get()); });
    echo_rounds(scaling_echo[1].get());
    other.join();
    return absl::ToDoubleSeconds(absl::Now() - t0);
  };
  DenseResult r;
  // Runs `f` and records the machine's cores busy meanwhile into `cores`; returns f's value.
  auto busy = [&](std::vector<double>* cores, bool keep, auto f) {
    const absl::Time t0 = absl::Now();
    const double v = f();
    if (keep && g_cpu != nullptr) cores->push_back(g_cpu->Between(t0, absl::Now()).cores_busy());
    return v;
  };
  const int runs = absl::GetFlag(FLAGS_runs);
  for (int run = 0; run <= runs; ++run) {  // Run 0 warms every path up.
    double te = 0, tg = 0;
    if (echo) {
      te = echo_rounds(tcp.get());
      tg = echo_rounds(grpc.get());
    }
    double te1 = 0, te2 = 0;
    if (!scaling_echo.empty()) {
      te1 = busy(&r.cores_tcp_one, run > 0, [&] { return echo_rounds(scaling_echo[0].get()); });
      te2 = busy(&r.cores_tcp_two, run > 0, [&] { return echo_two(); }) / rounds;
    }
    double tpush = ps_rounds(0);
    double tpull = ps_rounds(1);
    auto c0 = cs[0]->stats();
    auto s0 = ServerTimes(cs[0].get());
    const double tref = ref ? busy(&r.cores_one, run > 0, ref_rounds) : 0;
    double tpp = ref ? busy(&r.cores_pushpull, run > 0, [&] { return ps_rounds(2); }) : ps_rounds(2);
    auto c1 = cs[0]->stats();
    auto s1 = ServerTimes(cs[0].get());
    if (run == 0) continue;
    if (echo) {
      r.tcp.push_back(te);
      r.grpc.push_back(tg);
    }
    r.push.push_back(tpush);
    r.pull.push_back(tpull);
    r.pushpull.push_back(tpp);
    if (ref) r.one_pushpull.push_back(tref);
    if (!scaling_echo.empty()) {
      r.tcp_one.push_back(te1);
      r.tcp_two.push_back(te2);
    }
    r.client.plan_sec += c1.plan_sec - c0.plan_sec;
    r.client.send_sec += c1.send_sec - c0.send_sec;
    r.client.wait_sec += c1.wait_sec - c0.wait_sec;
    r.client.copy_sec += c1.copy_sec - c0.copy_sec;
    AddDelta(s0, s1, &r.server);
    r.pushpull_rounds += rounds;
  }
  Check(cs[0]->DropJob(), "drop");
  if (ref) Check(ref->DropJob(), "drop");
  return r;
}

// ------------------------------------------------------------------ sparse

class Zipf {
 public:
  Zipf(uint64_t n, double s) : cdf_(n) {
    double sum = 0;
    for (uint64_t i = 0; i < n; ++i) cdf_[i] = (sum += std::pow(static_cast<double>(i + 1), -s));
    for (auto& c : cdf_) c /= sum;
  }
  uint64_t operator()(std::mt19937_64& rng) const {
    double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
  }

 private:
  std::vector<double> cdf_;
};

constexpr uint64_t kKeySpace = 10'000'000;
constexpr uint32_t kWidth = 64;
constexpr int kRowsPerRequest = 1000;

v1::TableSpec SparseSpec() {
  v1::TableSpec t;
  t.set_name("emb");
  t.set_kind(v1::SPARSE);
  t.set_row_width(kWidth);
  t.set_key_space(kKeySpace);
  t.mutable_init()->set_kind(v1::InitializerSpec::NORMAL);
  t.mutable_init()->set_stddev(0.01f);
  *t.mutable_optimizer() = Opt(v1::OptimizerSpec::ADAGRAD, 0.05f);
  return t;
}

std::vector<std::vector<uint64_t>> ZipfRequests(const Zipf& zipf, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint64_t>> reqs(n, std::vector<uint64_t>(kRowsPerRequest));
  for (auto& r : reqs) {
    for (auto& k : r) k = zipf(rng);
  }
  return reqs;
}

// Rows/s (pushed + pulled) per run: the in-process table alone, then through one server with
// 1 and `threads` requests in flight, interleaved run by run.
struct SparseResult {
  std::vector<double> local, one, many;
};

SparseResult BenchSparse(const std::string& addr, const std::vector<std::vector<uint64_t>>& reqs,
                         int threads) {
  // In-process: the same table code, the same work per request (sum duplicate rows, apply,
  // read the next request's rows).
  auto spec = SparseSpec();
  auto opt = ResolveOptimizer(spec.optimizer(), "optimizer");
  TableInfo info(spec, *opt, 64);
  SparseTable table(&info);
  MemoryBudget budget(0);
  std::vector<float> grads(kRowsPerRequest * kWidth, 1e-3f);
  auto local_pass = [&]() {
    std::vector<float> rows(kRowsPerRequest * kWidth);
    for (size_t i = 0; i < reqs.size(); ++i) {
      std::vector<uint64_t> uniq(reqs[i]);
      std::sort(uniq.begin(), uniq.end());
      uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
      Check(table.Apply(uniq,
                        [&](size_t f, size_t k, float* out) {
                          std::copy_n(grads.data() + f % grads.size(), k, out);
                        },
                        &budget),
            "local apply");
      table.Read(reqs[(i + 1) % reqs.size()], v1::DT_FLOAT32,
                 reinterpret_cast<char*>(rows.data()));
    }
  };
  static int seq = 0;
  const std::string job = absl::StrCat("sparse", seq++);
  // One rank per request in flight: each rank pushes its steps in order, as workers do (a
  // worker's push may run at most one step ahead of its clock).
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int t = 0; t < threads; ++t) clients.push_back(MakeClient(job, {addr}, {SparseSpec()}, t, threads));
  std::vector<int64_t> steps(threads, 0);
  auto remote_pass = [&](int in_flight) {
    std::vector<std::thread> th;
    for (int t = 0; t < in_flight; ++t) {
      th.emplace_back([&, t] {
        std::vector<float> rows(kRowsPerRequest * kWidth);
        for (size_t i = t; i < reqs.size(); i += in_flight) {
          const auto& next = reqs[(i + 1) % reqs.size()];
          Check(clients[t]->PushPull(steps[t]++, {{}, {{"emb", reqs[i], grads.data()}}},
                                     {{}, {{"emb", next, rows.data()}}}),
                "sparse push-pull");
        }
      });
    }
    for (auto& x : th) x.join();
  };
  auto rate = [&](auto&& pass) {
    absl::Time t0 = absl::Now();
    pass();
    return 2.0 * kRowsPerRequest * reqs.size() / absl::ToDoubleSeconds(absl::Now() - t0);
  };
  SparseResult r;
  for (int run = 0; run <= absl::GetFlag(FLAGS_runs); ++run) {  // Run 0 creates the rows.
    double l = rate(local_pass);
    double o = rate([&] { remote_pass(1); });
    double m = rate([&] { remote_pass(threads); });
    if (run == 0) continue;
    r.local.push_back(l);
    r.one.push_back(o);
    r.many.push_back(m);
  }
  Check(clients[0]->DropJob(), "drop");
  return r;
}

// ------------------------------------------------------------------ report

int Main() {
  std::string server_bin = absl::GetFlag(FLAGS_server_binary);
  if (server_bin.empty()) {
    const char* rf = getenv("RUNFILES_DIR");
    server_bin = rf ? std::string(rf) + "/pscluster/server/ps_server"
                    : self_path + ".runfiles/pscluster/server/ps_server";
  }
  std::vector<size_t> sizes;
  for (auto s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    size_t v;
    if (!absl::SimpleAtoi(s, &v) || v < 4096) {
      fprintf(stderr, "--sizes: '%s' is not a size >= 4096\n", std::string(s).c_str());
      return 2;
    }
    sizes.push_back(v);
  }
  const std::string tmp = absl::StrCat("/tmp/ps_bench.", getpid());
  Check(MakeDirs(tmp), "tmp dir");
  ChildProcess tcp_echo(self_path, {"--serve=tcp"}, tmp + "/tcp.port");
  ChildProcess grpc_echo(
      self_path,
      {"--serve=grpc", "--echo_grpc_args=" + absl::GetFlag(FLAGS_echo_grpc_args)},
      tmp + "/grpc.port");
  const std::string ps_args = "--grpc_args=" + absl::GetFlag(FLAGS_ps_grpc_args);
  std::vector<std::string> server_flags = {"--log_level=warn", ps_args};
  for (auto f : absl::StrSplit(absl::GetFlag(FLAGS_ps_server_flags), ' ', absl::SkipEmpty())) {
    server_flags.emplace_back(f);
  }
  ChildProcess s0(server_bin, server_flags, tmp + "/s0.port");
  ChildProcess s1(server_bin, server_flags, tmp + "/s1.port");
  auto tcp_addr = tcp_echo.Address();
  auto grpc_addr = grpc_echo.Address();
  auto a0 = s0.Address();
  auto a1 = s1.Address();
  Check(tcp_addr.status(), "tcp echo server");
  Check(grpc_addr.status(), "grpc echo server");
  Check(a0.status(), absl::StrCat("ps_server ", server_bin).c_str());
  Check(a1.status(), "second ps_server");

  CpuSampler cpu({});
  g_cpu = &cpu;
  std::string out;
  auto line = [&](const std::string& s) {
    out += s + "\n";
    printf("%s\n", s.c_str());
    fflush(stdout);
  };
  unsigned cores = std::thread::hardware_concurrency();
  line(absl::StrCat("Machine: ", cores, " cores, loopback; ps_server and the echo servers in their "
                    "own processes; ps clients over ", absl::GetFlag(FLAGS_transport),
                    "; median of ", absl::GetFlag(FLAGS_runs), " runs",
                    absl::GetFlag(FLAGS_quick) ? " (--quick: not for the record)" : "", "."));
  line("");
  line("### Dense, 1 server x 1 client (GB/s = payload bytes per round / round time)");
  line("");
  line("| payload | block | raw TCP echo | gRPC echo | ps push | ps pull | ps push-pull | "
       "push-pull round | push-pull / TCP | push-pull / gRPC | round / TCP round |");
  line("|---|---|---|---|---|---|---|---|---|---|---|");
  std::vector<std::pair<size_t, DenseResult>> profiles;
  std::map<size_t, double> one_by_one;
  for (size_t b : sizes) {
    Progress(absl::StrCat("dense 1x1 with echo baselines, ", Size(b)));
    DenseResult d = BenchDense({*a0}, 1, b, *tcp_addr, *grpc_addr, true);
    const double tcp = Med(d.tcp), grpc = Med(d.grpc), pp = Med(d.pushpull);
    one_by_one[b] = b / pp;
    profiles.emplace_back(b, d);
    line(absl::StrCat("| ", Size(b), " | ", Size(std::min<size_t>(b, BlockElemsFor(b / 4) * 4)),
                      " | ", Gbs(b / tcp),
                      " (", Us(tcp), ") | ", Gbs(b / grpc), " (", Us(grpc), ") | ",
                      Gbs(b / Med(d.push)), " | ", Gbs(b / Med(d.pull)), " | ", Gbs(b / pp), " | ",
                      Us(pp), " | ", absl::StrFormat("%.2f", MedRatio(d.tcp, d.pushpull)), " | ",
                      absl::StrFormat("%.2f", MedRatio(d.grpc, d.pushpull)), " | ",
                      absl::StrFormat("%.2f×", MedRatio(d.pushpull, d.tcp)), " |"));
  }
  if (absl::GetFlag(FLAGS_only_1x1)) return 0;
  line("");
  line("### Dense, 2 servers x 2 clients (aggregate GB/s over both clients)");
  line("");
  line("Each run measures, one after the other: the raw TCP echo over one connection, then over two "
       "at once; the 2 x 2 push and pull; one client of the first server alone (push-pull, its own "
       "job); the 2 x 2 push-pull. The scaling ratios are medians of each run's own ratio.");
  line("");
  line("| payload | ps push | ps pull | ps push-pull | push-pull round | 1x1 push-pull in the same runs "
       "| aggregate / 1x1 push-pull (same runs) | against the 1x1 table above "
       "| raw TCP echo: 1 connection | 2 at once (aggregate) | TCP echo: 2 / 1 |");
  line("|---|---|---|---|---|---|---|---|---|---|---|");
  std::vector<std::string> busy_rows;
  auto busy_text = [](const std::vector<double>& v) { return absl::StrFormat("%.2f", Med(v)); };
  for (size_t b : sizes) {
    Progress(absl::StrCat("dense 2x2, ", Size(b)));
    DenseResult d = BenchDense({*a0, *a1}, 2, b, *tcp_addr, "", false, /*ref_1x1=*/true);
    busy_rows.push_back(absl::StrCat("| ", Size(b), " | ", busy_text(d.cores_tcp_one), " | ",
                                     busy_text(d.cores_tcp_two), " | ", busy_text(d.cores_one),
                                     " | ", busy_text(d.cores_pushpull), " | ",
                                     absl::StrFormat("%.2f", static_cast<double>(
                                                                 d.server.copies_on_write()) /
                                                                 std::max(1, d.pushpull_rounds)),
                                     " |"));
    const double pp = Med(d.pushpull);
    // Per run: (2b / 2x2 round) / (b / 1x1 round).
    std::vector<double> twice(d.one_pushpull.size());
    for (size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * d.one_pushpull[i];
    line(absl::StrCat("| ", Size(b), " | ", Gbs(2.0 * b / Med(d.push)), " | ",
                      Gbs(2.0 * b / Med(d.pull)), " | ", Gbs(2.0 * b / pp), " | ", Us(pp), " | ",
                      Gbs(b / Med(d.one_pushpull)), " | ",
                      absl::StrFormat("%.2f", MedRatio(twice, d.pushpull)), " | ",
                      absl::StrFormat("%.2f", (2.0 * b / pp) / one_by_one[b]), " | ",
                      Gbs(b / Med(d.tcp_one)), " | ", Gbs(2.0 * b / Med(d.tcp_two)), " | ",
                      absl::StrFormat("%.2f", 2 * MedRatio(d.tcp_one, d.tcp_two)), " |"));
  }
  line("");
  line(absl::StrCat("Cores busy on the whole machine (of ", cores, ") during each of those "
                    "measurements, medians over the runs: a measurement that already keeps every "
                    "core busy cannot gain from more connections or processes."));
  line("");
  line("| payload | raw TCP echo: 1 connection | 2 at once | ps push-pull 1 x 1 | ps push-pull 2 x 2 "
       "| blocks copied on write per 2 x 2 round (both servers) |");
  line("|---|---|---|---|---|---|");
  for (const std::string& row : busy_rows) line(row);
  line("");
  Progress("sparse: Zipf keys");
  Zipf zipf(kKeySpace, 1.1);
  auto reqs = ZipfRequests(zipf, absl::GetFlag(FLAGS_quick) ? 100 : 400, 42);
  Progress("sparse: in-process table and through the server");
  const int threads = absl::GetFlag(FLAGS_sparse_threads);
  SparseResult sp = BenchSparse(*a0, reqs, threads);
  line("### Sparse: 1k-row requests, width 64 (float32), Zipf(1.1) keys over 10^7 rows, "
       "Adagrad; rows pushed + pulled per second through 1 server");
  line("");
  line("| requests in flight | rows/s through ps_server | in-process table rows/s | ratio |");
  line("|---|---|---|---|");
  line(absl::StrCat("| 1 | ", absl::StrFormat("%.2fM", Med(sp.one) / 1e6), " | ",
                    absl::StrFormat("%.2fM", Med(sp.local) / 1e6), " | ",
                    absl::StrFormat("%.2f", MedRatio(sp.one, sp.local)), " |"));
  line(absl::StrCat("| ", threads, " | ", absl::StrFormat("%.2fM", Med(sp.many) / 1e6), " | ",
                    absl::StrFormat("%.2fM", Med(sp.local) / 1e6), " | ",
                    absl::StrFormat("%.2f", MedRatio(sp.many, sp.local)), " |"));
  line("");
  Progress("optimizer apply");
  ApplyResult ap = BenchApply(absl::GetFlag(FLAGS_runs));
  line("### Optimizer apply (Adam, float32, 16 MiB gradient; weights + 2 slots = 48 MiB more)");
  line("");
  line("| path | gradient GB/s | / single-thread memcpy of the gradient |");
  line("|---|---|---|");
  line(absl::StrCat("| memcpy (baseline, 16 MiB) | ", Gbs(ap.memcpy_bw), " | 1.00 |"));
  line(absl::StrCat("| optimizer kernel | ", Gbs(ap.kernel), " | ",
                    absl::StrFormat("%.2f", ap.kernel_ratio), " |"));
  line(absl::StrCat("| table apply from a received payload (64 KiB pieces) | ", Gbs(ap.table),
                    " | ", absl::StrFormat("%.2f", ap.table_ratio), " |"));
  line("");
  line("### Where a push-pull round goes (1 server x 1 client; per round)");
  line("");
  line("| payload | round | client plan+encode | client send | client wait | of which reply copy "
       "| server parse | server queue (summed over chunks) | server apply | server read | network + transport (rest) |");
  line("|---|---|---|---|---|---|---|---|---|---|---|");
  for (const auto& [b, d] : profiles) {
    const double n = d.pushpull_rounds;
    const double round = Med(d.pushpull);
    const double plan = d.client.plan_sec / n, send = d.client.send_sec / n;
    const double wait = d.client.wait_sec / n, copy = d.client.copy_sec / n;
    const double parse = d.server.parse_sec() / n, queue = d.server.queue_sec() / n;
    const double apply = d.server.apply_sec() / n, read = d.server.read_sec() / n;
    const double rest = std::max(0.0, wait - copy - parse - apply - read);
    line(absl::StrCat("| ", Size(b), " | ", Us(round), " | ", Us(plan), " | ", Us(send), " | ",
                      Us(wait), " | ", Us(copy), " | ", Us(parse), " | ", Us(queue), " | ",
                      Us(apply), " | ", Us(read), " | ", Us(rest), " |"));
  }
  if (!absl::GetFlag(FLAGS_out).empty()) {
    Check(WriteFileAtomically(absl::GetFlag(FLAGS_out), out), "--out");
  }
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace pscluster

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  pscluster::DisableMutexDeadlockDetection();
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  pscluster::bench::self_path = n > 0 ? std::string(buf, n) : argv[0];
  if (!absl::GetFlag(FLAGS_serve).empty()) {
    return pscluster::bench::ServeEcho(absl::GetFlag(FLAGS_serve), absl::GetFlag(FLAGS_port_file),
                                       pscluster::bench::EchoGrpcArgs());
  }
  signal(SIGPIPE, SIG_IGN);
  (void)pscluster::SetLogLevel("warn");
  return pscluster::bench::Main();
}
