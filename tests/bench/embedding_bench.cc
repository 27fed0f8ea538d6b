// A large embedding table on one server under a memory cap with a disk tier (--spill_dir),
// against the same traffic on an uncapped server, measured in the same run.
//
//   bazel run -c opt //tests/bench:embedding_bench -- --keys=100000000 --memory_bytes=2147483648
//
// 1. Fill: every one of --keys keys (width --width, Adagrad) is pushed once, in batches, through
//    the data plane (PsClient) into a ps_server with --memory_bytes and --spill_dir: the rate.
// 2. Traffic: --steps steps (after --warmup_steps unmeasured ones), each a pull then a push of
//    --batch keys drawn from Zipf(--zipf) over the keys (ranks scattered over the key space by a
//    bijective hash), rows per second counted as rows pulled plus rows pushed; the server's RAM
//    hit ratio over the measured steps, spills and peak RSS (VmHWM).
// 3. Baseline: the same steps against a ps_server without a cap, holding only the keys the run
//    touches (rows made by their first push). Ratio = capped rows/s / uncapped rows/s.
// 4. With --checkpoint_dir: the capped server checkpoints both tiers there (time, file size, its
//    peak RSS before and after), and a second capped server restores the file (time, peak RSS)
//    and must give the same rows, bit for bit, for a sample of the keys.
#include <unistd.h>

#include <cmath>
#include <memory>
#include <optional>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/sharding.h"
#include "proto/ps.grpc.pb.h"
#include "server/client/ps_client.h"
#include "tests/bench/ps_bench_process.h"

ABSL_FLAG(uint64_t, keys, 1000000, "keys in the table (the issue's target: 100000000)");
ABSL_FLAG(uint32_t, width, 16, "row width (floats)");
ABSL_FLAG(uint64_t, memory_bytes, 0,
          "the capped server's --memory_bytes (0 = a quarter of the table's rows and Adagrad state)");
ABSL_FLAG(double, zipf, 1.1, "Zipf exponent of the traffic");
ABSL_FLAG(uint32_t, batch, 8192, "keys per pull and per push in the traffic phase");
ABSL_FLAG(uint32_t, fill_batch, 65536, "keys per push while filling");
ABSL_FLAG(int, steps, 300, "traffic steps (a pull and a push each) per server");
ABSL_FLAG(int, warmup_steps, 0,
          "traffic steps run before the measured ones, not counted (the capped server's memory "
          "then holds the traffic's hot rows, not the fill's last ones)");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "also checkpoint the capped server into this directory and restore it on another");
ABSL_FLAG(std::string, spill_dir, "", "disk tier directory (default: $TEST_TMPDIR or /tmp)");
ABSL_FLAG(std::string, server_binary, "", "ps_server binary (default: from the runfiles)");

namespace pscluster {
namespace {

void Die(const absl::Status& s, const std::string& what) {
  if (s.ok()) return;
  std::fprintf(stderr, "embedding_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

v1::ShardMap MapOf(const std::string& job, const std::string& addr) {
  v1::ShardMap m;
  m.set_job_id(job);
  m.set_epoch(1);
  m.set_num_virtual_shards(64);
  for (uint32_t s = 0; s < 64; ++s) {
    auto* a = m.add_assignments();
    a->set_shard(s);
    a->set_primary("s0");
  }
  auto* e = m.add_servers();
  e->set_node_id("s0");
  e->set_address(addr);
  return m;
}

// Zipf(s) ranks in [1, n] by inverting the continuous approximation of its CDF.
class Zipf {
 public:
  Zipf(uint64_t n, double s, uint64_t seed) : n_(n), s_(s), rng_(seed) {}
  uint64_t Next() {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    const double a = 1 - s_;
    const double x = std::pow((std::pow(static_cast<double>(n_) + 1, a) - 1) * u + 1, 1 / a);
    return std::min<uint64_t>(n_, std::max<uint64_t>(1, static_cast<uint64_t>(x)));
  }

 private:
  uint64_t n_;
  double s_;
  std::mt19937_64 rng_;
};

uint64_t KeyOfRank(uint64_t rank) { return Mix64(rank); }  // Bijective: no two ranks share a key.

uint64_t ProcKb(int pid, const std::string& field) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10);
  }
  return 0;
}

struct CheckpointRun {
  double checkpoint_sec = 0, restore_sec = 0;
  uint64_t bytes = 0;
  uint64_t peak_before_kb = 0, peak_after_kb = 0;                  // The checkpointing server.
  uint64_t restore_peak_before_kb = 0, restore_peak_after_kb = 0;  // The restoring server.
  v1::TableStatus restored;
  bool same_rows = false;
};

struct Run {
  double rows_per_sec = 0;
  double fill_rows_per_sec = 0;
  v1::TableStatus table;
  uint64_t peak_rss_kb = 0, rss_kb = 0, rss_after_start_kb = 0;
  uint64_t distinct = 0;
  v1::TableStatus before_measured;  // The table's counters before the measured steps.
  std::optional<CheckpointRun> checkpoint;
};

// A ps_server child with the job's table created, and a client for it.
struct Started {
  std::unique_ptr<bench::ChildProcess> process;
  std::string address;
  std::unique_ptr<PsClient> client;
  int pid = 0;
  v1::ServerStatus Status() {
    auto st = client->ServerStatuses();
    Die(st.status(), "status");
    return (*st)[0];
  }
};

Started Start(const std::string& server_bin, const std::vector<std::string>& args,
              const std::string& name) {
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp");
  Started s;
  s.process = std::make_unique<bench::ChildProcess>(
      server_bin, args, absl::StrCat(dir, "/embedding_bench_", name, ".port"));
  auto addr = s.process->Address();
  Die(addr.status(), "starting ps_server");
  s.address = *addr;
  const uint32_t width = absl::GetFlag(FLAGS_width);
  v1::TableSpec t;
  t.set_name("emb");
  t.set_kind(v1::SPARSE);
  t.set_row_width(width);
  t.mutable_init()->set_kind(v1::InitializerSpec::NORMAL);
  t.mutable_init()->set_stddev(0.01f);
  t.mutable_init()->set_seed(1);
  t.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAGRAD);
  t.mutable_optimizer()->set_learning_rate(0.05f);
  PsClientOptions o;
  o.job_id = "emb";
  o.call_timeout = absl::Seconds(600);
  auto client = PsClient::Create(o, MapOf("emb", *addr), {t});
  Die(client.status(), "client");
  Die((*client)->InstallShardMap(), "shard map");
  v1::ConsistencySpec asp;
  asp.set_mode(v1::ConsistencySpec::ASP);
  Die((*client)->CreateTables(asp, 1), "tables");
  s.client = std::move(*client);
  s.pid = static_cast<int>(s.Status().pid());
  return s;
}

// Every 1000th rank's row.
std::vector<float> PullSample(PsClient& client, int64_t clock, uint64_t n) {
  std::vector<uint64_t> keys;
  for (uint64_t rank = 1; rank <= n; rank += 1000) keys.push_back(KeyOfRank(rank));
  std::vector<float> rows(keys.size() * absl::GetFlag(FLAGS_width));
  Die(client.Pull(clock, {{}, {{"emb", keys, rows.data()}}}), "sample pull");
  return rows;
}

CheckpointRun CheckpointAndRestore(Started& from, const std::string& server_bin,
                                   const std::vector<std::string>& args, int64_t clock) {
  CheckpointRun c;
  const uint64_t n = absl::GetFlag(FLAGS_keys);
  const std::vector<float> saved = PullSample(*from.client, clock, n);
  c.peak_before_kb = ProcKb(from.pid, "VmHWM");
  absl::Time t0 = absl::Now();
  auto files = from.client->Checkpoint(absl::GetFlag(FLAGS_checkpoint_dir));
  Die(files.status(), "checkpoint");
  c.checkpoint_sec = absl::ToDoubleSeconds(absl::Now() - t0);
  c.peak_after_kb = ProcKb(from.pid, "VmHWM");
  c.bytes = (*files)[0].bytes();
  std::fprintf(stderr, "  checkpoint: %.1f MiB in %.1f s, restoring it on another server\n",
               c.bytes / 1048576.0, c.checkpoint_sec);
  Started to = Start(server_bin, args, "restored");
  c.restore_peak_before_kb = ProcKb(to.pid, "VmHWM");
  auto stub = v1::ParameterServer::NewStub(*MakeChannel(to.address));
  v1::RestoreRequest req;
  req.set_job_id("emb");
  req.set_path((*files)[0].path());
  v1::RestoreResponse resp;
  grpc::ClientContext ctx;
  t0 = absl::Now();
  grpc::Status st = stub->Restore(&ctx, req, &resp);
  if (!st.ok()) Die(absl::InternalError(st.error_message()), "restore");
  c.restore_sec = absl::ToDoubleSeconds(absl::Now() - t0);
  c.restore_peak_after_kb = ProcKb(to.pid, "VmHWM");
  c.restored = to.Status().jobs(0).tables(0);
  c.same_rows = PullSample(*to.client, clock, n) == saved;
  return c;
}

Run RunOn(const std::string& server_bin, const std::vector<std::string>& args, bool fill,
          const std::string& name) {
  Started server = Start(server_bin, args, name);
  std::unique_ptr<PsClient>& client = server.client;
  auto status = [&] { return server.Status(); };
  const uint32_t width = absl::GetFlag(FLAGS_width);
  const int pid = server.pid;
  Run r;
  r.rss_after_start_kb = ProcKb(pid, "VmRSS");
  int64_t step = 0;
  const uint64_t n = absl::GetFlag(FLAGS_keys);
  if (fill) {
    // A push's rows must fit in memory together: at most an eighth of the cap per push.
    uint32_t fb = absl::GetFlag(FLAGS_fill_batch);
    for (const std::string& a : args) {
      if (a.rfind("--memory_bytes=", 0) == 0) {
        const uint64_t cap_rows = std::strtoull(a.c_str() + 15, nullptr, 10) / (uint64_t{width} * 8);
        fb = static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(fb, cap_rows / 8)));
      }
    }
    std::vector<uint64_t> keys;
    std::vector<float> g(static_cast<size_t>(fb) * width, 0.001f);
    const absl::Time start = absl::Now();
    absl::Time report = start + absl::Seconds(30);
    for (uint64_t first = 0; first < n; first += fb) {
      keys.clear();
      for (uint64_t k = first; k < std::min(n, first + fb); ++k) keys.push_back(KeyOfRank(k + 1));
      Die(client->Push(step++, {{}, {{"emb", keys, g.data()}}}), "fill push");
      if (absl::Now() > report) {
        std::fprintf(stderr, "  fill: %llu of %llu keys, %.0f rows/s\n",
                     static_cast<unsigned long long>(first + keys.size()),
                     static_cast<unsigned long long>(n),
                     (first + keys.size()) / absl::ToDoubleSeconds(absl::Now() - start));
        report += absl::Seconds(30);
      }
    }
    r.fill_rows_per_sec = n / absl::ToDoubleSeconds(absl::Now() - start);
    std::fprintf(stderr, "  fill: done, %llu keys in %.0f s, %.0f rows/s\n",
                 static_cast<unsigned long long>(n), absl::ToDoubleSeconds(absl::Now() - start),
                 r.fill_rows_per_sec);
  }
  Zipf zipf(n, absl::GetFlag(FLAGS_zipf), 42);
  const uint32_t batch = absl::GetFlag(FLAGS_batch);
  std::vector<uint64_t> keys;
  std::vector<float> rows(static_cast<size_t>(batch) * width), g(static_cast<size_t>(batch) * width);
  absl::flat_hash_set<uint64_t> touched, in_batch;
  uint64_t moved = 0;
  absl::Duration busy;
  const int warmup = absl::GetFlag(FLAGS_warmup_steps);
  for (int s = 0; s < warmup + absl::GetFlag(FLAGS_steps); ++s) {
    if (s == warmup && warmup > 0) {
      r.before_measured = status().jobs(0).tables(0);
      touched.clear();
    }
    if (s == warmup) {
      std::fprintf(stderr, "  %s: measuring %d steps%s\n", name.c_str(),
                   absl::GetFlag(FLAGS_steps),
                   warmup > 0 ? absl::StrCat(" after ", warmup, " warm-up steps").c_str() : "");
    }
    keys.clear();
    in_batch.clear();
    while (keys.size() < batch) {
      const uint64_t k = KeyOfRank(zipf.Next());
      if (in_batch.insert(k).second) keys.push_back(k);
    }
    touched.insert(keys.begin(), keys.end());
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.001f * static_cast<float>(i % 7) - 0.003f;
    const absl::Time t0 = absl::Now();
    Die(client->Pull(step, {{}, {{"emb", keys, rows.data()}}}), "pull");
    Die(client->Push(step, {{}, {{"emb", keys, g.data()}}}), "push");
    if (s >= warmup) {
      busy += absl::Now() - t0;
      moved += 2 * keys.size();
    }
    ++step;
  }
  r.rows_per_sec = moved / absl::ToDoubleSeconds(busy);
  r.distinct = touched.size();
  r.table = status().jobs(0).tables(0);
  r.peak_rss_kb = ProcKb(pid, "VmHWM");
  r.rss_kb = ProcKb(pid, "VmRSS");
  if (fill && !absl::GetFlag(FLAGS_checkpoint_dir).empty()) {
    r.checkpoint = CheckpointAndRestore(server, server_bin, args, step);
  }
  return r;
}

int Main() {
  std::string bin = absl::GetFlag(FLAGS_server_binary);
  if (bin.empty()) {
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[len > 0 ? len : 0] = '\0';
    const char* rf = getenv("RUNFILES_DIR");
    bin = rf ? std::string(rf) + "/pscluster/server/ps_server"
             : std::string(self) + ".runfiles/pscluster/server/ps_server";
  }
  const uint64_t n = absl::GetFlag(FLAGS_keys);
  const uint32_t width = absl::GetFlag(FLAGS_width);
  const uint64_t row_bytes = uint64_t{width} * 2 * sizeof(float);
  uint64_t cap = absl::GetFlag(FLAGS_memory_bytes);
  if (cap == 0) cap = n * row_bytes / 4;
  std::string spill = absl::GetFlag(FLAGS_spill_dir);
  if (spill.empty()) spill = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  std::printf("keys %llu, width %u, Adagrad (%llu B per row), cap %llu B (%.1f%% of the rows), "
              "Zipf(%.2f), %d steps of %u keys pulled and pushed (after %d unmeasured)\n",
              static_cast<unsigned long long>(n), width, static_cast<unsigned long long>(row_bytes),
              static_cast<unsigned long long>(cap), 100.0 * cap / (n * row_bytes),
              absl::GetFlag(FLAGS_zipf), absl::GetFlag(FLAGS_steps), absl::GetFlag(FLAGS_batch),
              absl::GetFlag(FLAGS_warmup_steps));
  std::fflush(stdout);
  const Run capped = RunOn(bin, {absl::StrCat("--memory_bytes=", cap), "--spill_dir=" + spill,
                                 "--log_level=warn"},
                           /*fill=*/true, "capped");
  const Run ram = RunOn(bin, {"--log_level=warn"}, /*fill=*/false, "uncapped");
  const auto& t = capped.table;
  // Over the measured steps (and the fill's touches when there is no warm-up).
  const double hits = double(t.ram_hits()) - double(capped.before_measured.ram_hits());
  const double reads = double(t.disk_reads()) - double(capped.before_measured.disk_reads());
  const double hit = hits + reads > 0 ? hits / (hits + reads) : 0;
  std::printf("\n| server | fill rows/s | traffic rows/s | rows in RAM | rows on disk | RAM hit "
              "ratio | spills | peak RSS MiB | RSS at start MiB |\n|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| capped, disk tier | %.0f | %.0f | %llu | %llu | %.3f | %llu | %.0f | %.0f |\n",
              capped.fill_rows_per_sec, capped.rows_per_sec,
              static_cast<unsigned long long>(t.rows() - t.rows_on_disk()),
              static_cast<unsigned long long>(t.rows_on_disk()), hit,
              static_cast<unsigned long long>(t.spills()), capped.peak_rss_kb / 1024.0,
              capped.rss_after_start_kb / 1024.0);
  std::printf("| uncapped, in RAM (keys touched only) | - | %.0f | %llu | 0 | 1 | 0 | %.0f | %.0f |\n",
              ram.rows_per_sec, static_cast<unsigned long long>(ram.table.rows()),
              ram.peak_rss_kb / 1024.0, ram.rss_after_start_kb / 1024.0);
  std::printf("\ndistinct keys the traffic touched: %llu; capped / uncapped traffic rows/s: %.3f; "
              "peak RSS over the cap: %.0f MiB\n",
              static_cast<unsigned long long>(ram.distinct), capped.rows_per_sec / ram.rows_per_sec,
              capped.peak_rss_kb / 1024.0 - cap / 1048576.0);
  if (capped.checkpoint.has_value()) {
    const CheckpointRun& c = *capped.checkpoint;
    std::printf("\n| checkpoint of both tiers | file MiB | seconds | MB/s | peak RSS MiB before | "
                "after |\n|---|---|---|---|---|---|\n");
    std::printf("| written by the capped server | %.1f | %.1f | %.0f | %.0f | %.0f |\n",
                c.bytes / 1048576.0, c.checkpoint_sec, c.bytes / 1e6 / c.checkpoint_sec,
                c.peak_before_kb / 1024.0, c.peak_after_kb / 1024.0);
    std::printf("| restored by another capped server | %.1f | %.1f | %.0f | %.0f | %.0f |\n",
                c.bytes / 1048576.0, c.restore_sec, c.bytes / 1e6 / c.restore_sec,
                c.restore_peak_before_kb / 1024.0, c.restore_peak_after_kb / 1024.0);
    std::printf("\nrestored: %llu rows (%llu on disk) of %llu; a sample of %llu rows %s\n",
                static_cast<unsigned long long>(c.restored.rows()),
                static_cast<unsigned long long>(c.restored.rows_on_disk()),
                static_cast<unsigned long long>(t.rows()),
                static_cast<unsigned long long>((n + 999) / 1000),
                c.same_rows ? "bit for bit as saved" : "DIFFERS from what was saved");
    if (!c.same_rows || c.restored.rows() != t.rows()) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pscluster::Main();
}
