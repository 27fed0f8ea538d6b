// Scheduler benchmark.
//
//  1. Heartbeats: N nodes (simulated in-process clients over real gRPC on loopback) register
//     with an in-process scheduler, then heartbeat at a fixed rate; reports heartbeat latency
//     percentiles beside a baseline measured in the same run: the same clients calling the
//     standard grpc.health.v1 Check (an empty unary call on the same server) at the same rate.
//  2. Registration: RegisterNode latency with every commit fsynced (the durable path).
//  3. Placement scale simulation (no network): 1,000 servers and 10,000 workers; time to place a
//     job over all of them and to re-place after one server dies, beside the time to serialise
//     the resulting shard map (what pushing it to one node costs) and with the shards moved.
//
//   bazel run -c opt //tests/bench:sched_bench -- [--nodes=1000] [--seconds=4]
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/logging.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/placement.h"
#include "scheduler/scheduler_daemon.h"

ABSL_FLAG(int32_t, nodes, 1000, "heartbeating nodes");
ABSL_FLAG(double, seconds, 6, "measured seconds per call type and rate (in 3 rounds)");
ABSL_FLAG(absl::Duration, warmup, absl::Milliseconds(500), "unmeasured start of each round");
ABSL_FLAG(int32_t, channels, 8, "client channels the simulated nodes share");
ABSL_FLAG(int32_t, sim_servers, 1000, "placement simulation: servers");
ABSL_FLAG(int32_t, sim_workers, 10000, "placement simulation: workers");
ABSL_FLAG(int32_t, sim_shards, 65536, "placement simulation: virtual shards");
ABSL_FLAG(int32_t, sim_repeats, 5, "placement simulation: runs per measurement (median kept)");

namespace pscluster::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;  // Microseconds.
  size_t n = 0;
};

Percentiles Summarize(std::vector<int64_t> ns) {
  Percentiles p;
  p.n = ns.size();
  if (ns.empty()) return p;
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) {
    size_t i = std::min(ns.size() - 1, static_cast<size_t>(q * (ns.size() - 1) + 0.5));
    return ns[i] / 1000.0;
  };
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  p.p999 = at(0.999);
  p.max = ns.back() / 1000.0;
  return p;
}

// Sends one async call per node per interval, evenly spread, and records each latency.
struct Phase {
  std::string name;
  std::vector<int64_t> latencies_ns;
  int64_t sent = 0;
  std::atomic<int64_t> errors{0};
  double seconds = 0;
};

template <typename Send>
void RunPhase(Phase& phase, int nodes, absl::Duration interval, double seconds, Send send) {
  absl::Mutex mu;
  std::atomic<int64_t> in_flight{0};
  const absl::Duration warmup = std::min(absl::GetFlag(FLAGS_warmup), interval * 2);
  const int64_t total_ns = absl::ToInt64Nanoseconds(warmup + absl::Seconds(seconds));
  const double gap_ns = absl::ToDoubleNanoseconds(interval) / nodes;
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point measure_from = t0 + std::chrono::nanoseconds(absl::ToInt64Nanoseconds(warmup));
  int64_t k = 0;
  while (true) {
    Clock::time_point now = Clock::now();
    int64_t elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(now - t0).count();
    if (elapsed >= total_ns) break;
    // Every call due by now goes out.
    while (k * gap_ns <= elapsed) {
      int node = k % nodes;
      ++k;
      bool measured = now >= measure_from;
      if (measured) ++phase.sent;
      in_flight.fetch_add(1);
      Clock::time_point start = Clock::now();
      send(node, [&, start, measured](bool ok) {
        int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start)
                         .count();
        if (measured) {
          if (!ok) phase.errors.fetch_add(1);
          absl::MutexLock l(&mu);
          phase.latencies_ns.push_back(ns);
        }
        in_flight.fetch_sub(1);
      });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  while (in_flight.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  phase.seconds = seconds;
}

void PrintRow(const std::string& name, const Phase& ph, const Percentiles& p) {
  std::printf("| %s | %.0f | %zu | %.0f | %.0f | %.0f | %.0f | %.0f | %lld |\n", name.c_str(),
              ph.sent / ph.seconds, p.n, p.p50, p.p90, p.p99, p.p999, p.max,
              static_cast<long long>(ph.errors.load()));
}

template <typename F>
double MedianMs(int repeats, F f) {
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    absl::Time t = absl::Now();
    f();
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int HeartbeatBench() {
  const int nodes = absl::GetFlag(FLAGS_nodes);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::string db = absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp",
                                "/sched_bench_", getpid(), ".db");
  std::remove(db.c_str());
  scheduler::SchedulerDaemonOptions o;
  o.listen_address = "127.0.0.1:0";
  o.db_path = db;
  o.db_full_sync = true;
  o.scheduler.lease = absl::Seconds(30);
  auto daemon = scheduler::SchedulerDaemon::Start(o);
  if (!daemon.ok()) {
    std::fprintf(stderr, "sched_bench: %s\n", std::string(daemon.status().message()).c_str());
    return 1;
  }
  std::vector<std::unique_ptr<v1::Scheduler::Stub>> stubs;
  std::vector<std::unique_ptr<grpc::health::v1::Health::Stub>> health;
  for (int i = 0; i < absl::GetFlag(FLAGS_channels); ++i) {
    // Distinct channel arguments keep gRPC from sharing one connection between the channels.
    ChannelOptions co;
    co.max_message_bytes = (64 << 20) + i;
    auto ch = MakeChannel((*daemon)->address(), co);
    stubs.push_back(v1::Scheduler::NewStub(*ch));
    health.push_back(grpc::health::v1::Health::NewStub(*ch));
  }

  // Registration (each one a durable SQLite commit).
  std::vector<std::string> ids(nodes);
  std::vector<int64_t> reg_ns;
  for (int i = 0; i < nodes; ++i) {
    v1::RegisterNodeRequest req;
    v1::NodeInfo* n = req.mutable_node();
    bool server = i % 5 == 0;  // 1 server for 4 workers.
    n->set_role(server ? v1::ROLE_SERVER : v1::ROLE_WORKER);
    n->set_address(absl::StrCat("10.", i / 250, ".", i % 250, ".1:7000"));
    n->mutable_capacity()->set_cpu_slots(1);
    n->mutable_capacity()->set_memory_bytes(uint64_t{16} << 30);
    n->set_pid(10000 + i);
    v1::RegisterNodeResponse resp;
    auto ctx = CallContext(absl::Seconds(10));
    // The first call on each channel also connects it: wait through a failed first attempt
    // (seen once in CI: "tcp handshaker shutdown") instead of failing the run.
    ctx->set_wait_for_ready(true);
    Clock::time_point t = Clock::now();
    grpc::Status s = stubs[i % stubs.size()]->RegisterNode(ctx.get(), req, &resp);
    reg_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
    if (!s.ok()) {
      std::fprintf(stderr, "register: %s\n", s.error_message().c_str());
      return 1;
    }
    ids[i] = resp.node_id();
  }
  Percentiles reg = Summarize(reg_ns);

  // Heartbeats: servers carry per-shard load like a real server would (16 shards each).
  std::vector<v1::HeartbeatRequest> beats(nodes);
  for (int i = 0; i < nodes; ++i) {
    beats[i].set_node_id(ids[i]);
    beats[i].mutable_load()->set_bytes_per_sec(1e6 + i);
    beats[i].mutable_load()->set_memory_used_bytes(uint64_t{1} << 30);
    if (i % 5 == 0) {
      for (int s = 0; s < 16; ++s) {
        v1::ShardLoad* l = beats[i].add_shard_loads();
        l->set_job_id("job-1");
        l->set_shard(s);
        l->mutable_load()->set_bytes_per_sec(1e5);
      }
    }
  }
  struct HbCall {
    grpc::ClientContext ctx;
    v1::HeartbeatResponse resp;
  };
  struct HealthCall {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
  };
  auto heartbeat = [&](int node, std::function<void(bool)> done) {
    auto* c = new HbCall();
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    stubs[node % stubs.size()]->async()->Heartbeat(&c->ctx, &beats[node], &c->resp,
                                                   [c, done](grpc::Status s) {
                                                     done(s.ok());
                                                     delete c;
                                                   });
  };
  auto check = [&](int node, std::function<void(bool)> done) {
    auto* c = new HealthCall();
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    health[node % health.size()]->async()->Check(&c->ctx, &c->req, &c->resp,
                                                 [c, done](grpc::Status s) {
                                                   done(s.ok());
                                                   delete c;
                                                 });
  };

  std::printf("## Heartbeats: %d nodes (%d servers with 16 shard loads each), %d client "
              "channels\n\n",
              nodes, (nodes + 4) / 5, absl::GetFlag(FLAGS_channels));
  std::printf("| call | rate /s | calls | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | errors |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::pair<std::string, double>> ratios;
  for (absl::Duration interval : {absl::Seconds(1), absl::Milliseconds(100)}) {
    std::string every = absl::FormatDuration(interval);
    // Alternating rounds, so that load from elsewhere on the machine hits both alike.
    Phase base, hb;
    const int rounds = 3;
    for (int r = 0; r < rounds; ++r) {
      Phase b1, h1;
      RunPhase(b1, nodes, interval, seconds / rounds, check);
      RunPhase(h1, nodes, interval, seconds / rounds, heartbeat);
      for (auto [from, to] : {std::pair<Phase*, Phase*>{&b1, &base}, {&h1, &hb}}) {
        to->latencies_ns.insert(to->latencies_ns.end(), from->latencies_ns.begin(),
                                from->latencies_ns.end());
        to->sent += from->sent;
        to->errors += from->errors.load();
        to->seconds += from->seconds;
      }
    }
    Percentiles pb = Summarize(base.latencies_ns);
    Percentiles ph = Summarize(hb.latencies_ns);
    PrintRow(absl::StrCat("baseline: health Check, each node every ", every), base, pb);
    PrintRow(absl::StrCat("Heartbeat, each node every ", every), hb, ph);
    ratios.push_back({every, pb.p99 > 0 ? ph.p99 / pb.p99 : 0});
  }
  std::printf("\n");
  for (const auto& [every, r] : ratios) {
    std::printf("Heartbeat p99 / baseline p99 (every %s): %.2f\n", every.c_str(), r);
  }
  std::printf("\n## Registration (durable: every commit fsynced), %d nodes\n\n", nodes);
  std::printf("RegisterNode latency: p50 %.0f µs, p99 %.0f µs, max %.0f µs\n\n", reg.p50, reg.p99,
              reg.max);
  (*daemon)->Shutdown();
  std::remove(db.c_str());
  return 0;
}

int PlacementBench() {
  const int ns = absl::GetFlag(FLAGS_sim_servers);
  const int nw = absl::GetFlag(FLAGS_sim_workers);
  const int shards = absl::GetFlag(FLAGS_sim_shards);
  const int repeats = absl::GetFlag(FLAGS_sim_repeats);
  std::vector<scheduler::ServerCandidate> servers(ns);
  for (int i = 0; i < ns; ++i) {
    servers[i].node_id = absl::StrCat("server-", i + 1);
    servers[i].address = absl::StrCat("10.1.", i / 250, ".", i % 250, ":7000");
    servers[i].memory_bytes = (uint64_t{32} + i % 4 * 16) << 30;  // 32-80 GiB, mixed.
    servers[i].memory_used_bytes = uint64_t(i % 7) << 30;
    servers[i].bytes_per_sec = (i % 11) * 1e7;
  }
  std::vector<scheduler::WorkerCandidate> workers(nw);
  for (int i = 0; i < nw; ++i) {
    workers[i].node_id = absl::StrCat("worker-", i + 1);
    workers[i].address = absl::StrCat("10.2.", i / 250, ".", i % 250, ":7000");
    workers[i].gpus = i % 3 == 0 ? 8 : (i % 3 == 1 ? 1 : 0);
    workers[i].cpu_slots = 4;
  }
  scheduler::CapacityPlacement policy;
  std::printf("## Placement scale simulation: %d servers, %d workers, %d virtual shards\n\n", ns,
              nw, shards);
  std::printf("| replication | place (ms) | re-place after a server dies (ms) | re-place / place | "
              "serialise the map (ms) | map size | shards moved | shards the dead server held |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (uint32_t replication : {1u, 3u}) {
    scheduler::PlacementRequest req;
    req.job_id = "job-1";
    req.num_servers = ns;
    req.num_workers = nw / 3;  // GPU job: 1 GPU per worker, best fit.
    req.gpus_per_worker = 1;
    req.num_virtual_shards = shards;
    req.replication = replication;
    absl::StatusOr<scheduler::Placement> placed;
    double place_ms = MedianMs(repeats, [&] { placed = policy.Place(req, servers, workers); });
    if (!placed.ok()) {
      std::fprintf(stderr, "place: %s\n", std::string(placed.status().message()).c_str());
      return 1;
    }
    const std::string dead = placed->shard_map.assignments(0).primary();
    std::vector<scheduler::ServerCandidate> live;
    for (const auto& s : servers) {
      if (s.node_id != dead) live.push_back(s);
    }
    absl::StatusOr<v1::ShardMap> after;
    double replace_ms = MedianMs(repeats, [&] { after = policy.Replace(placed->shard_map, dead, live); });
    if (!after.ok()) return 1;
    int moved = 0, held = 0;
    for (int i = 0; i < shards; ++i) {
      const auto& a = placed->shard_map.assignments(i);
      const auto& b = after->assignments(i);
      bool had = a.primary() == dead;
      for (const auto& x : a.backups()) had = had || x == dead;
      held += had;
      bool same = a.primary() == b.primary() && a.backups_size() == b.backups_size();
      for (int k = 0; same && k < a.backups_size(); ++k) same = a.backups(k) == b.backups(k);
      moved += !same;
    }
    std::string bytes;
    double ser_ms = MedianMs(repeats, [&] { bytes = after->SerializeAsString(); });
    absl::Status check = scheduler::CheckShardMap(*after);
    std::printf("| %u | %.2f | %.2f | %.3f | %.2f | %.2f MB | %d | %d%s |\n", replication,
                place_ms, replace_ms, replace_ms / place_ms, ser_ms, bytes.size() / 1e6, moved,
                held, check.ok() ? "" : " (INVALID MAP)");
  }
  std::printf("\n");
  return 0;
}

}  // namespace
}  // namespace pscluster::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  pscluster::DisableMutexDeadlockDetection();
  (void)pscluster::SetLogLevel("warn");
  std::printf("# Scheduler benchmark (%ld cores)\n\n", sysconf(_SC_NPROCESSORS_ONLN));
  int rc = pscluster::bench::HeartbeatBench();
  if (rc != 0) return rc;
  return pscluster::bench::PlacementBench();
}
