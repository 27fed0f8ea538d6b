// A straggler, with and without data balancing: real daemons (ps_scheduler, 2 ps_server, 2
// ps_worker on loopback, as the e2e tests start them) train the e2e tests' Fashion-MNIST MLP
// under BSP. Three runs, each on a fresh cluster:
//
//   undisturbed      both workers at full speed (the baseline of the ratios);
//   straggler        the worker of rank 1 stopped (SIGSTOP) for --stop_ms of every
//                    --stop_ms + --run_ms from step 20 on, equal data parts;
//   straggler, balanced   the same straggler, `balance_data: true` (the scheduler's
//                    --data_balance_every_ms=3000).
//
// Prints, per run, the job's wall time (scheduler: started to finished), samples/s (epochs *
// 60,000 / time), the ratio to the undisturbed run, the final data shares and the test accuracy.
//
//   bazel run -c opt //tests/bench:straggler_bench -- [--epochs=10] [--stop_ms=12 --run_ms=8]
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tests/cluster/e2e_cluster.h"

ABSL_FLAG(int, epochs, 10, "epochs per run (300 steps each)");
ABSL_FLAG(int, stop_ms, 12, "the straggler is stopped this long ...");
ABSL_FLAG(int, run_ms, 8, "... then runs this long, over and over");
ABSL_FLAG(int, hidden, 64, "hidden units of the MLP");

namespace pscluster::testing {
namespace {

struct Result {
  std::string name;
  double seconds = 0;
  double samples_per_sec = 0;
  std::string shares = "equal";
  double test_accuracy = -1;
  uint32_t rebalances = 0;
};

absl::StatusOr<Result> RunOnce(const std::string& name, bool straggle, bool balance) {
  E2eClusterOptions o;
  o.servers = 2;
  o.workers = 2;
  o.scheduler_args = {"--data_balance_every_ms=3000"};
  auto cluster = E2eCluster::Start(absl::StrCat("straggler-", straggle, balance), o);
  if (!cluster.ok()) return cluster.status();
  E2eCluster& c = **cluster;
  const int epochs = absl::GetFlag(FLAGS_epochs);
  std::string yaml = FashionJobYaml("straggler", epochs, "", absl::GetFlag(FLAGS_hidden));
  if (balance) yaml += "balance_data: true\n";
  CommandResult submit = c.Psctl({"submit", c.WriteFile("job.yaml", yaml)});
  if (submit.exit_code != 0) return absl::InternalError(submit.output);
  v1::Job seen;
  if (!WaitFor(absl::Seconds(120), [&] {
        auto j = c.GetJob("job-1");
        if (j.ok()) seen = *j;
        return j.ok() && (j->state() != v1::JOB_RUNNING || j->progress().step() >= 20) &&
               j->state() != v1::JOB_QUEUED && j->state() != v1::JOB_PLACING;
      })) {
    return absl::DeadlineExceededError(absl::StrCat("the job did not start: ", c.LogTails()));
  }
  std::atomic<bool> stop{false};
  std::thread slow;
  if (straggle && seen.workers_size() == 2) {
    const std::string node = seen.workers(1);
    const auto stop_for = std::chrono::milliseconds(absl::GetFlag(FLAGS_stop_ms));
    const auto run_for = std::chrono::milliseconds(absl::GetFlag(FLAGS_run_ms));
    slow = std::thread([&, node, stop_for, run_for] {
      while (!stop.load()) {
        (void)c.processes().Signal(node, SIGSTOP);
        std::this_thread::sleep_for(stop_for);
        (void)c.processes().Signal(node, SIGCONT);
        std::this_thread::sleep_for(run_for);
      }
    });
  }
  auto done = c.WaitForEnd("job-1", absl::Seconds(900));
  stop.store(true);
  if (slow.joinable()) slow.join();
  if (!done.ok()) return done.status();
  if (done->state() != v1::JOB_SUCCEEDED) {
    return absl::InternalError(absl::StrCat("job ended ", done->reason(), c.LogTails()));
  }
  Result r;
  r.name = name;
  r.seconds = (done->finished_unix_ms() - done->started_unix_ms()) / 1000.0;
  r.samples_per_sec = epochs * 60000.0 / r.seconds;
  if (done->recovery().data_shares_size() > 0) {
    double total = 0;
    for (uint32_t s : done->recovery().data_shares()) total += s;
    std::vector<std::string> parts;
    for (uint32_t s : done->recovery().data_shares()) {
      parts.push_back(absl::StrFormat("%.0f%%", 100.0 * s / total));
    }
    r.shares = absl::StrJoin(parts, " / ");
  }
  r.rebalances = done->recovery().rebalances();
  r.test_accuracy = done->progress().test_accuracy();
  return r;
}

int Main() {
  std::vector<Result> results;
  const std::tuple<const char*, bool, bool> runs[] = {
      {"undisturbed", false, false},
      {"straggler, equal parts", true, false},
      {"straggler, balance_data", true, true}};
  for (const auto& [name, straggle, balance] : runs) {
    std::fprintf(stderr, "== %s\n", name);
    auto r = RunOnce(name, straggle, balance);
    if (!r.ok()) {
      std::fprintf(stderr, "%s: %s\n", name, std::string(r.status().message()).c_str());
      return 1;
    }
    results.push_back(*r);
  }
  std::printf("\nFashion-MNIST MLP 784-%d-10, BSP, 2 servers x 2 workers, %d epochs; straggler: "
              "rank 1's worker stopped %d ms of every %d ms from step 20 on\n\n",
              absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_epochs),
              absl::GetFlag(FLAGS_stop_ms),
              absl::GetFlag(FLAGS_stop_ms) + absl::GetFlag(FLAGS_run_ms));
  std::printf("| run | job time s | samples/s | ratio to undisturbed | data shares (changes) | "
              "test acc |\n|---|---|---|---|---|---|\n");
  for (const Result& r : results) {
    std::printf("| %s | %.1f | %.0f | %.2f | %s (%u) | %.4f |\n", r.name.c_str(), r.seconds,
                r.samples_per_sec, r.samples_per_sec / results[0].samples_per_sec,
                r.shares.c_str(), r.rebalances, r.test_accuracy);
  }
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
    char tmpl[] = "/tmp/straggler_bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return 1;
    setenv("TEST_TMPDIR", tmpl, 1);
  }
  return pscluster::testing::Main();
}
