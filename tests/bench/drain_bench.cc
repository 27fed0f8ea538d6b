// Draining a server that holds about 1 GB of a running job's shards: real daemons (ps_scheduler,
// 2 ps_server, 1 ps_worker on loopback, as the e2e tests start them). One job, a Fashion-MNIST
// MLP 784-H-10 (H = --hidden; SGD, so the server holds the weights and nothing more) placed on
// one server, trains under BSP with one worker; `psctl drain` moves every shard of it to the
// other server with the live moves (a snapshot and the primary's clocks, forwarded updates, the
// switch once the copy holds them), and the worker keeps training meanwhile.
//
// Prints the bytes the drained server held, the drain's wall time (psctl drain, start to
// "drained"), the steps the job made meanwhile and, against the step time measured before the
// drain in the same run (the baseline), the training time the job lost: drain time minus
// (steps during the drain x baseline step time). The step time after the drain is printed too.
//
//   bazel run -c opt //tests/bench:drain_bench -- [--hidden=330000] [--measure_s=30]
#include <stdlib.h>

#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/cluster/e2e_cluster.h"

ABSL_FLAG(int, hidden, 330000, "hidden units of the MLP (330000: about 1.05 GB of float32 weights)");
ABSL_FLAG(int, batch, 8, "batch size");
ABSL_FLAG(int, measure_s, 30, "seconds over which the step time is measured before and after");

namespace pscluster::testing {
namespace {

// Bytes of `job`'s tables held by the server process `name` (0 if it holds none).
uint64_t JobBytesOn(const E2eCluster& c, const std::string& name, const std::string& job) {
  auto st = c.ServerStatus(name);
  if (!st.ok()) return 0;
  uint64_t bytes = 0;
  for (const v1::JobOnServer& j : st->jobs()) {
    if (j.job_id() != job) continue;
    for (const v1::TableStatus& t : j.tables()) bytes += t.bytes();
  }
  return bytes;
}

struct Sample {
  absl::Time at;
  int64_t step = 0;
};

// The worker's own step count (its status, not the progress reports, which lag).
absl::StatusOr<Sample> StepNow(const E2eCluster& c) {
  auto w = c.WorkerStatus("worker-1");
  if (!w.ok()) return w.status();
  if (!w->busy()) return absl::FailedPreconditionError("worker-1 runs no task");
  return Sample{absl::Now(), static_cast<int64_t>(w->step())};
}

// Seconds per step over `seconds` of training.
absl::StatusOr<double> StepTime(const E2eCluster& c, int seconds) {
  auto a = StepNow(c);
  if (!a.ok()) return a.status();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  auto b = StepNow(c);
  if (!b.ok()) return b.status();
  if (b->step <= a->step) return absl::InternalError("no step completed while measuring");
  return absl::ToDoubleSeconds(b->at - a->at) / static_cast<double>(b->step - a->step);
}

int Main() {
  E2eClusterOptions o;
  o.servers = 2;
  o.workers = 1;
  o.startup_timeout = absl::Seconds(120);
  auto cluster = E2eCluster::Start("drain_bench", o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", std::string(cluster.status().message()).c_str());
    return 1;
  }
  E2eCluster& c = **cluster;
  const int hidden = absl::GetFlag(FLAGS_hidden);
  const std::string yaml = absl::StrCat(
      "name: drain\nmodel: {kind: mlp, hidden: [", hidden,
      "]}\ndataset: {name: fashion_mnist}\noptimizer: {kind: sgd, learning_rate: 0.01}\n"
      "consistency: {mode: bsp}\nnum_servers: 1\nnum_workers: 1\ngpus_per_worker: 0\n"
      "device: cpu\nepochs: 100\nbatch_size: ",
      absl::GetFlag(FLAGS_batch), "\nnum_virtual_shards: 16\nseed: 7\n");
  CommandResult submit = c.Psctl({"submit", c.WriteFile("job.yaml", yaml)});
  if (submit.exit_code != 0) {
    std::fprintf(stderr, "submit: %s\n", submit.output.c_str());
    return 1;
  }
  std::fprintf(stderr, "submitted; waiting for 3 steps (the server fills %d x 784 weights)\n",
               hidden);
  v1::Job seen;
  if (!WaitFor(absl::Seconds(900), [&] {
        auto j = c.GetJob("job-1");
        if (j.ok()) seen = *j;
        return j.ok() && j->state() != v1::JOB_QUEUED && j->state() != v1::JOB_PLACING &&
               (j->state() != v1::JOB_RUNNING || j->progress().step() >= 3);
      }) ||
      seen.state() != v1::JOB_RUNNING || seen.servers_size() != 1) {
    std::fprintf(stderr, "the job did not start: %s\n%s\n", seen.DebugString().c_str(),
                 c.LogTails().c_str());
    return 1;
  }
  const std::string source = seen.servers(0);
  const std::string target = source == "server-1" ? "server-2" : "server-1";
  const uint64_t bytes = JobBytesOn(c, source, "job-1");
  std::fprintf(stderr, "%s holds %.3f GB of job-1; measuring the step time for %d s\n",
               source.c_str(), bytes / 1e9, absl::GetFlag(FLAGS_measure_s));
  auto before = StepTime(c, absl::GetFlag(FLAGS_measure_s));
  if (!before.ok()) {
    std::fprintf(stderr, "%s\n", std::string(before.status().message()).c_str());
    return 1;
  }

  std::fprintf(stderr, "draining %s\n", source.c_str());
  auto d0 = StepNow(c);
  CommandResult drained = c.Psctl({"drain", source}, absl::Minutes(30));
  auto d1 = StepNow(c);
  if (drained.exit_code != 0 || !d0.ok() || !d1.ok()) {
    std::fprintf(stderr, "drain: %s\n%s\n", drained.output.c_str(), c.LogTails().c_str());
    return 1;
  }
  std::fprintf(stderr, "%s", drained.output.c_str());
  const double drain_s = absl::ToDoubleSeconds(d1->at - d0->at);
  const int64_t steps = d1->step - d0->step;
  const uint64_t left = JobBytesOn(c, source, "job-1");
  const uint64_t moved = JobBytesOn(c, target, "job-1");
  auto after = StepTime(c, absl::GetFlag(FLAGS_measure_s));
  if (!after.ok()) {
    std::fprintf(stderr, "%s\n", std::string(after.status().message()).c_str());
    return 1;
  }
  (void)c.Psctl({"cancel", "job-1"});

  const double lost = drain_s - steps * *before;
  std::printf(
      "\nFashion-MNIST MLP 784-%d-10, SGD, batch %d, BSP, 1 worker; 16 virtual shards on one "
      "server, drained to the other\n\n",
      hidden, absl::GetFlag(FLAGS_batch));
  std::printf(
      "| GB on the drained server | GB on the target after | GB left | drain s | steps during "
      "the drain | s/step before (baseline) | s/step after | training time lost s | lost / "
      "drain |\n|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| %.3f | %.3f | %.3f | %.1f | %lld | %.3f | %.3f | %.1f | %.2f |\n", bytes / 1e9,
              moved / 1e9, left / 1e9, drain_s, static_cast<long long>(steps), *before, *after,
              lost, lost / drain_s);
  return 0;
}

}  // namespace
}  // namespace pscluster::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Outside `bazel test`: the daemons are in this binary's runfiles, scratch goes to /tmp.
  if (std::getenv("TEST_SRCDIR") == nullptr) {
    std::string runfiles = std::getenv("RUNFILES_DIR") != nullptr
                               ? std::getenv("RUNFILES_DIR")
                               : absl::StrCat(argv[0], ".runfiles");
    setenv("TEST_SRCDIR", runfiles.c_str(), 1);
  }
  if (std::getenv("TEST_TMPDIR") == nullptr) {
    char tmpl[] = "/tmp/drain_bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return 1;
    setenv("TEST_TMPDIR", tmpl, 1);
  }
  return pscluster::testing::Main();
}
