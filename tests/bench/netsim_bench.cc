// The dense data plane over shaped links (tests/netsim): one ps_server on a host of its own, one
// client (this process) on another, each host's link shaped with tc tbf to each rate in turn;
// beside it, in the same run, a raw TCP echo through the same links, and both again over
// loopback inside one host (no shaping) as the baseline. Reports throughput (payload bits each
// way per round) against the link rate, the TCP echo and loopback — ratios, not timed
// assertions. Then (--two_by_two) 2 ps_servers x 2 clients, each on a host of its own (one job,
// its shards split over both servers; the second client a process of this binary on its host):
// the aggregate push-pull of both clients against a 1 x 1 measured right before it in each run.
// Needs root.
//
//   bazel run -c opt //tests/bench:netsim_bench -- [--rates=10gbit,1gbit,100mbit]
//       [--sizes=4194304,67108864] [--runs=3] [--min_run_sec=1] [--two_by_two] [--out=FILE]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/sharding.h"
#include "server/client/ps_client.h"
#include "tests/bench/ps_bench_baselines.h"
#include "tests/bench/ps_bench_process.h"
#include "tests/netsim/netsim.h"

ABSL_FLAG(std::string, rates, "10gbit,1gbit,100mbit", "link rates to measure, in turn");
ABSL_FLAG(std::string, sizes, "4194304,67108864", "dense payload sizes in bytes");
ABSL_FLAG(int, runs, 3, "runs per measurement (the median is reported)");
ABSL_FLAG(double, min_run_sec, 1.0, "each run repeats rounds for at least this long (2 at least)");
ABSL_FLAG(std::string, out, "", "also write the report (markdown) to this file");
ABSL_FLAG(std::string, server_binary, "", "ps_server to launch (default: from the runfiles)");
ABSL_FLAG(std::string, serve_echo, "", "internal: run a TCP echo server on this host");
ABSL_FLAG(std::string, port_file, "", "internal: port file of --serve_echo");
ABSL_FLAG(bool, two_by_two, true,
          "also measure 2 ps_servers x 2 clients, each on a host of its own, against 1 x 1");
ABSL_FLAG(std::string, pushpull_client, "",
          "internal: the second client of the 2 x 2: push-pull rounds against these servers");
ABSL_FLAG(std::string, job, "", "internal: the job of --pushpull_client");
ABSL_FLAG(int64_t, bytes, 0, "internal: the payload of --pushpull_client");
ABSL_FLAG(std::string, sync_dir, "",
          "internal: --pushpull_client runs window N once sync_dir/go.N exists and writes "
          "'rounds seconds' to sync_dir/result.N");

namespace pscluster::bench {
namespace {

std::string self_path;

void Progress(const std::string& s) {
  fprintf(stderr, "[netsim_bench] %s\n", s.c_str());
  fflush(stderr);
}

void Check(const absl::Status& st, const std::string& what) {
  if (!st.ok()) {
    Progress(absl::StrCat(what, ": ", st.ToString()));
    exit(1);
  }
}

// A TCP echo server bound to `host` (one thread per connection).
int ServeEchoOn(const std::string& host, const std::string& port_file) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
      bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(s, 16) != 0) {
    perror("echo");
    return 1;
  }
  socklen_t len = sizeof(addr);
  getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  if (!WriteFileAtomically(port_file, absl::StrCat(host, ":", ntohs(addr.sin_port), "\n")).ok()) {
    return 1;
  }
  while (true) {
    int c = accept(s, nullptr, nullptr);
    if (c < 0) continue;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::thread([c] {
      std::vector<char> buf(4 << 20);
      for (ssize_t n; (n = read(c, buf.data(), buf.size())) > 0;) {
        for (ssize_t off = 0; off < n;) {
          ssize_t w = write(c, buf.data() + off, n - off);
          if (w <= 0) return;
          off += w;
        }
      }
      close(c);
    }).detach();
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Rounds repeated for at least --min_run_sec (2 at least): {rounds, seconds}; TimeRounds gives the
// seconds per round.
template <typename F>
std::pair<int, double> Rounds(F round) {
  const absl::Time t0 = absl::Now();
  int n = 0;
  while (n < 2 || absl::Now() - t0 < absl::Seconds(absl::GetFlag(FLAGS_min_run_sec))) {
    round();
    ++n;
  }
  return {n, absl::ToDoubleSeconds(absl::Now() - t0)};
}
template <typename F>
double TimeRounds(F round) {
  const auto [n, sec] = Rounds(round);
  return sec / n;
}

// One client of one ps_server, a dense table of `bytes`, over the TCP data port.
struct PsPair {
  std::unique_ptr<PsClient> client;
  std::vector<float> grad, vals;
  int64_t step = 0;
};

// A client of `job` over the servers at `addresses`, as worker `rank` of `workers`; rank 0
// declares the tables. The table's blocks (`block_elems`; 0 = tensor/8, 256 KiB .. 4 MiB) are
// spread over the servers so that each holds as many as the hashing of blocks to shards allows.
PsPair MakeClient(const std::string& job, const std::vector<std::string>& addresses,
                  size_t bytes, uint32_t rank, uint32_t workers, uint64_t block_elems = 0) {
  const uint64_t elems = bytes / 4;
  if (block_elems == 0) block_elems = std::clamp<uint64_t>(elems / 8, 1 << 16, 1 << 20);
  v1::TableSpec t;
  t.set_name("t");
  t.set_kind(v1::DENSE);
  t.mutable_shape()->add_dims(elems);
  t.set_block_elems(block_elems);
  t.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  t.mutable_optimizer()->set_learning_rate(1e-6f);
  v1::ShardMap m;
  m.set_job_id(job);
  m.set_epoch(1);
  m.set_num_virtual_shards(16);
  // Blocks per virtual shard; then the shards, most blocks first, each to the server holding
  // the fewest blocks so far.
  std::vector<uint64_t> blocks_in(16, 0);
  for (uint64_t b = 0; b < NumBlocks(elems, block_elems); ++b) {
    ++blocks_in[ShardOfBlock(TableHash("t"), b, 16)];
  }
  std::vector<uint32_t> shards(16);
  for (uint32_t s = 0; s < 16; ++s) shards[s] = s;
  std::stable_sort(shards.begin(), shards.end(),
                   [&](uint32_t x, uint32_t y) { return blocks_in[x] > blocks_in[y]; });
  std::vector<uint64_t> held(addresses.size(), 0);
  std::vector<size_t> server_of(16, 0);
  for (uint32_t s : shards) {
    const size_t least = std::min_element(held.begin(), held.end()) - held.begin();
    server_of[s] = least;
    held[least] += blocks_in[s];
  }
  for (uint32_t s = 0; s < 16; ++s) {
    auto* a = m.add_assignments();
    a->set_shard(s);
    a->set_primary(absl::StrCat("s", server_of[s]));
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    auto* e = m.add_servers();
    e->set_node_id(absl::StrCat("s", i));
    e->set_address(addresses[i]);
  }
  PsClientOptions o;
  o.job_id = job;
  o.worker = rank;
  o.call_timeout = absl::Seconds(300);
  o.data_transport = DataTransport::kTcp;  // The same path over loopback and over the links.
  auto c = PsClient::Create(o, m, {t});
  Check(c.status(), "client");
  if (rank == 0) {
    Check((*c)->InstallShardMap(), "install shard map");
    v1::ConsistencySpec asp;
    asp.set_mode(v1::ConsistencySpec::ASP);
    Check((*c)->CreateTables(asp, workers), "create tables");
  }
  PsPair p;
  p.client = std::move(*c);
  p.grad.assign(elems, 1e-3f);
  p.vals.assign(elems, 0.f);
  return p;
}

PsPair MakePair(const std::string& address, size_t bytes, uint64_t block_elems = 0) {
  static int seq = 0;
  return MakeClient(absl::StrCat("netsim", seq++), {address}, bytes, 0, 1, block_elems);
}

// The 2 x 2's blocks: 16 per table (at least 16 KiB, at most 4 MiB), so that even a small payload
// splits between the two servers.
uint64_t TwoByTwoBlockElems(size_t bytes) {
  return std::clamp<uint64_t>(bytes / 4 / 16, 1 << 12, 1 << 20);
}

struct Result {
  double echo = 0, pushpull = 0;  // Seconds per round, medians.
};

// Push-pull rounds of `p` for about --min_run_sec; returns {rounds, seconds}.
void PushPullOnce(PsPair& p) {
  Check(p.client->PushPull(p.step++, {{{"t", p.grad.data()}}, {}}, {{{"t", p.vals.data()}}, {}}),
        "push-pull");
}
std::pair<int, double> PushPullWindow(PsPair& p) {
  return Rounds([&] { PushPullOnce(p); });
}

// The 2 x 2's second client (--pushpull_client, in its own host): rank 1 of --job. Says it is
// ready through --port_file, then runs one window per go.N file the parent makes.
int RunPushPullClient() {
  const std::vector<std::string> addresses =
      absl::StrSplit(absl::GetFlag(FLAGS_pushpull_client), ',');
  const std::string dir = absl::GetFlag(FLAGS_sync_dir);
  const size_t bytes = absl::GetFlag(FLAGS_bytes);
  PsPair p = MakeClient(absl::GetFlag(FLAGS_job), addresses, bytes, 1, 2,
                        TwoByTwoBlockElems(bytes));
  for (int i = 0; i < 2; ++i) PushPullOnce(p);  // Connections made, buffers touched.
  Check(WriteFileAtomically(absl::GetFlag(FLAGS_port_file), "ready\n"), "--port_file");
  for (int run = 0; run <= absl::GetFlag(FLAGS_runs); ++run) {
    const std::string go = absl::StrCat(dir, "/go.", run);
    while (access(go.c_str(), F_OK) != 0) absl::SleepFor(absl::Microseconds(200));
    const auto [n, sec] = PushPullWindow(p);
    Check(WriteFileAtomically(absl::StrCat(dir, "/result.", run), absl::StrCat(n, " ", sec, "\n")),
          "result file");
  }
  return 0;
}

struct ScaleResult {
  double one = 0;        // 1 x 1 push-pull, seconds per round (median).
  double aggregate = 0;  // 2 x 2: payload bytes per second each way, both clients (median).
  double ratio = 0;      // Median over runs of (2 x 2 aggregate) / (1 x 1 of the same run).
};

// 2 x 2 on the links: this process (on "client") and a child on "client2" push-pull one job whose
// shards alternate between the servers on "server" and "server2"; each run measures this
// process's 1 x 1 against the first server (its own job) right before.
ScaleResult MeasureTwoByTwo(netsim::Network& net, const std::string& ps_a, const std::string& ps_b,
                            size_t bytes, const std::string& tmp) {
  static int seq = 0;
  const std::string job = absl::StrCat("netsim2x2-", seq);
  const std::string dir = absl::StrCat(tmp, "/2x2-", seq++);
  Check(MakeDirs(dir), "2x2 dir");
  PsPair one = MakePair(ps_a, bytes, TwoByTwoBlockElems(bytes));
  PsPair mine = MakeClient(job, {ps_a, ps_b}, bytes, 0, 2, TwoByTwoBlockElems(bytes));
  std::vector<std::string> argv = net.Command(
      "client2",
      {self_path, "--pushpull_client=" + ps_a + "," + ps_b, "--job=" + job,
       absl::StrCat("--bytes=", bytes), absl::StrCat("--runs=", absl::GetFlag(FLAGS_runs)),
       absl::StrCat("--min_run_sec=", absl::GetFlag(FLAGS_min_run_sec)), "--sync_dir=" + dir});
  ChildProcess other(argv[0], {argv.begin() + 1, argv.end()}, dir + "/ready");
  Check(other.Address(absl::Seconds(60)).status(), "the second client on host client2");
  for (int i = 0; i < 2; ++i) PushPullWindow(one);
  std::vector<double> ones, aggregates, ratios;
  for (int run = 0; run <= absl::GetFlag(FLAGS_runs); ++run) {  // Run 0 warms up.
    const auto [n1, s1] = PushPullWindow(one);
    Check(WriteFileAtomically(absl::StrCat(dir, "/go.", run), "go\n"), "go file");
    const auto [n2, s2] = PushPullWindow(mine);
    absl::StatusOr<std::string> theirs;
    const std::string result = absl::StrCat(dir, "/result.", run);
    for (int i = 0; i < 60000; ++i) {
      theirs = ReadFile(result);
      if (theirs.ok()) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
    Check(theirs.status(), "the second client's result");
    const std::vector<std::string> parts = absl::StrSplit(*theirs, absl::ByAnyChar(" \n"),
                                                          absl::SkipEmpty());
    int n3 = 0;
    double s3 = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &n3) || !absl::SimpleAtod(parts[1], &s3) ||
        s3 <= 0) {
      Check(absl::DataLossError(absl::StrCat(result, ": '", *theirs, "'")), "result file");
    }
    if (run == 0) continue;
    const double one_rate = bytes * n1 / s1;
    const double aggregate = bytes * n2 / s2 + bytes * n3 / s3;
    ones.push_back(s1 / n1);
    aggregates.push_back(aggregate);
    ratios.push_back(aggregate / one_rate);
  }
  Check(one.client->DropJob(), "drop job");
  Check(mine.client->DropJob(), "drop job");
  return {Median(ones), Median(aggregates), Median(ratios)};
}

// Echo and push-pull, interleaved run by run (a run 0 warms both up).
Result Measure(const std::string& echo_addr, const std::string& ps_addr, size_t bytes) {
  auto echo = ConnectTcpEcho(echo_addr);
  Check(echo.status(), "echo connect " + echo_addr);
  PsPair p = MakePair(ps_addr, bytes);
  std::vector<double> e, pp;
  for (int run = 0; run <= absl::GetFlag(FLAGS_runs); ++run) {
    const double te = TimeRounds([&] { Check((*echo)->Round(bytes).status(), "echo round"); });
    const double tp = TimeRounds([&] { PushPullOnce(p); });
    if (run == 0) continue;
    e.push_back(te);
    pp.push_back(tp);
  }
  Check(p.client->DropJob(), "drop job");
  return {Median(e), Median(pp)};
}

std::string Size(size_t b) {
  return b >= (1 << 20) ? absl::StrCat(b >> 20, " MiB") : absl::StrCat(b >> 10, " KiB");
}
std::string Mbits(double bytes, double sec) {
  return absl::StrFormat("%.0f", bytes * 8 / sec / 1e6);
}

int Main(netsim::Network& net, const std::vector<std::string>& rates,
         const std::vector<size_t>& sizes) {
  std::string server_bin = absl::GetFlag(FLAGS_server_binary);
  if (server_bin.empty()) {
    const char* rf = getenv("RUNFILES_DIR");
    server_bin = rf ? std::string(rf) + "/pscluster/server/ps_server"
                    : self_path + ".runfiles/pscluster/server/ps_server";
  }
  const std::string tmp = absl::StrCat("/tmp/netsim_bench.", getpid());
  Check(MakeDirs(tmp), "tmp dir");
  const std::string server_ip = net.host("server")->address;
  // Over the links: ps_server and the echo on the server host.
  std::vector<std::string> remote_ps =
      net.Command("server", {server_bin, "--log_level=warn", "--listen=" + server_ip + ":0"});
  ChildProcess ps_remote(remote_ps[0], {remote_ps.begin() + 1, remote_ps.end()},
                         tmp + "/ps_remote.port");
  std::vector<std::string> remote_echo =
      net.Command("server", {self_path, "--serve_echo=" + server_ip});
  ChildProcess echo_remote(remote_echo[0], {remote_echo.begin() + 1, remote_echo.end()},
                           tmp + "/echo_remote.port");
  // Loopback: both on this (the client's) host.
  ChildProcess ps_local(server_bin, {"--log_level=warn", "--listen=127.0.0.1:0"},
                        tmp + "/ps_local.port");
  ChildProcess echo_local(self_path, {"--serve_echo=127.0.0.1"}, tmp + "/echo_local.port");
  auto a_ps_remote = ps_remote.Address();
  auto a_echo_remote = echo_remote.Address();
  auto a_ps_local = ps_local.Address();
  auto a_echo_local = echo_local.Address();
  Check(a_ps_remote.status(), "ps_server on the server host");
  Check(a_echo_remote.status(), "echo on the server host");
  Check(a_ps_local.status(), "ps_server on loopback");
  Check(a_echo_local.status(), "echo on loopback");

  std::string out;
  auto line = [&](const std::string& s) {
    out += s + "\n";
    printf("%s\n", s.c_str());
    fflush(stdout);
  };
  line(absl::StrCat(
      "Machine: ", std::thread::hardware_concurrency(),
      " cores. 1 ps_server x 1 client over the TCP data port; client and server on netsim hosts "
      "of their own, each host's link shaped both ways with tc tbf (no delay emulation); the "
      "raw TCP echo on the server's host, through the same links; loopback = both inside one "
      "host, unshaped. Mbit/s = payload bits each way / round time (a push-pull round pushes "
      "the payload and pulls it back; an echo round sends it and receives it back). Median of ",
      absl::GetFlag(FLAGS_runs), " runs, each >= ", absl::GetFlag(FLAGS_min_run_sec),
      " s of rounds; echo and push-pull interleaved run by run."));
  line("");
  line(
      "| payload | link | raw TCP echo Mbit/s | push-pull Mbit/s | push-pull round | echo / link "
      "rate | push-pull / link rate | push-pull / TCP echo | push-pull / loopback push-pull |");
  line("|---|---|---|---|---|---|---|---|---|");
  for (size_t b : sizes) {
    Progress(absl::StrCat(Size(b), " over loopback"));
    const Result lo = Measure(*a_echo_local, *a_ps_local, b);
    line(absl::StrCat("| ", Size(b), " | loopback (baseline) | ", Mbits(b, lo.echo), " | ",
                      Mbits(b, lo.pushpull), " | ", absl::StrFormat("%.1f ms", lo.pushpull * 1e3),
                      " | – | – | ", absl::StrFormat("%.2f", lo.echo / lo.pushpull), " | 1.00 |"));
    for (const std::string& rate : rates) {
      Check(net.SetRate("client", rate), "shape the client's link");
      Check(net.SetRate("server", rate), "shape the server's link");
      const double bits = *netsim::ParseRate(rate);
      Progress(absl::StrCat(Size(b), " over ", rate, " links"));
      const Result r = Measure(*a_echo_remote, *a_ps_remote, b);
      line(absl::StrCat("| ", Size(b), " | ", rate, " | ", Mbits(b, r.echo), " | ",
                        Mbits(b, r.pushpull), " | ", absl::StrFormat("%.1f ms", r.pushpull * 1e3),
                        " | ", absl::StrFormat("%.2f", b * 8 / r.echo / bits), " | ",
                        absl::StrFormat("%.2f", b * 8 / r.pushpull / bits), " | ",
                        absl::StrFormat("%.2f", r.echo / r.pushpull), " | ",
                        absl::StrFormat("%.2f", lo.pushpull / r.pushpull), " |"));
    }
  }
  if (absl::GetFlag(FLAGS_two_by_two)) {
    const std::string server2_ip = net.host("server2")->address;
    std::vector<std::string> remote_ps2 =
        net.Command("server2", {server_bin, "--log_level=warn", "--listen=" + server2_ip + ":0"});
    ChildProcess ps_remote2(remote_ps2[0], {remote_ps2.begin() + 1, remote_ps2.end()},
                            tmp + "/ps_remote2.port");
    auto a_ps_remote2 = ps_remote2.Address();
    Check(a_ps_remote2.status(), "ps_server on the server2 host");
    line("");
    line(absl::StrCat(
        "2 ps_servers x 2 clients, each on a host of its own (one job, its table in 16 blocks "
        "spread evenly over the servers; the second client is a process on host client2), "
        "every link at the rate shown. Aggregate = payload bytes each way per second summed over "
        "both clients; 1 x 1 = one client of the first server alone (same block size), measured "
        "right before in each run. Median of ", absl::GetFlag(FLAGS_runs), " runs."));
    line("");
    line("| payload | link | 1 x 1 push-pull Mbit/s | 2 x 2 aggregate Mbit/s | 2 x 2 / 1 x 1 (same "
         "runs) | 2 x 2 aggregate / link rate |");
    line("|---|---|---|---|---|---|");
    for (size_t b : sizes) {
      for (const std::string& rate : rates) {
        for (const char* h : {"client", "client2", "server", "server2"}) {
          Check(net.SetRate(h, rate), absl::StrCat("shape ", h, "'s link"));
        }
        const double bits = *netsim::ParseRate(rate);
        Progress(absl::StrCat(Size(b), " 2 x 2 over ", rate, " links"));
        const ScaleResult r = MeasureTwoByTwo(net, *a_ps_remote, *a_ps_remote2, b, tmp);
        line(absl::StrCat("| ", Size(b), " | ", rate, " | ", Mbits(b, r.one), " | ",
                          absl::StrFormat("%.0f", r.aggregate * 8 / 1e6), " | ",
                          absl::StrFormat("%.2f", r.ratio), " | ",
                          absl::StrFormat("%.2f", r.aggregate * 8 / bits), " |"));
      }
    }
  }
  if (!absl::GetFlag(FLAGS_out).empty())
    Check(WriteFileAtomically(absl::GetFlag(FLAGS_out), out), "--out");
  return 0;
}

}  // namespace
}  // namespace pscluster::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  pscluster::bench::self_path = n > 0 ? std::string(buf, n) : argv[0];
  if (!absl::GetFlag(FLAGS_serve_echo).empty()) {
    return pscluster::bench::ServeEchoOn(absl::GetFlag(FLAGS_serve_echo),
                                         absl::GetFlag(FLAGS_port_file));
  }
  if (!absl::GetFlag(FLAGS_pushpull_client).empty()) {
    signal(SIGPIPE, SIG_IGN);
    (void)pscluster::SetLogLevel("warn");
    return pscluster::bench::RunPushPullClient();
  }
  std::vector<std::string> rates =
      absl::StrSplit(absl::GetFlag(FLAGS_rates), ',', absl::SkipEmpty());
  for (const std::string& r : rates) {
    auto bits = pscluster::netsim::ParseRate(r);
    if (!bits.ok() || *bits == 0) {
      fprintf(stderr, "--rates: '%s' is not a link rate (100mbit, 1gbit, 10gbit)\n", r.c_str());
      return 2;
    }
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
  // The network first, and this process into the client's host, before anything starts a thread.
  auto net = pscluster::netsim::Network::Create();
  if (!net.ok()) {
    fprintf(stderr, "netsim_bench: %s\n", net.status().ToString().c_str());
    return 1;
  }
  std::vector<std::string> hosts = {"client", "server"};
  if (absl::GetFlag(FLAGS_two_by_two)) {
    hosts.push_back("client2");
    hosts.push_back("server2");
  }
  for (const std::string& host : hosts) {
    auto h = (*net)->AddHost(host, rates.empty() ? "" : rates[0]);
    if (!h.ok()) {
      fprintf(stderr, "netsim_bench: %s\n", h.status().ToString().c_str());
      return 1;
    }
  }
  absl::Status st = (*net)->Enter("client");
  if (!st.ok()) {
    fprintf(stderr, "netsim_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  (void)pscluster::SetLogLevel("warn");
  return pscluster::bench::Main(**net, rates, sizes);
}
