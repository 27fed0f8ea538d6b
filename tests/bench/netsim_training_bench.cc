// Fashion-MNIST MLP training over shaped links (tests/netsim): the real scheduler, one ps_server
// and one ps_worker, each on a host of its own whose link is shaped to --rate; the same job is
// trained with each compression in turn (float32, fp16 transport, top-k 1% with error feedback,
// int8 with error feedback, top-k 1% with fp16 transport, top-k both ways: pushes and pulls) in
// the same run, and its training throughput (samples/s, from the scheduler's progress while the
// job runs: steps × batch over the time between the first and last progress seen) and final test
// accuracy reported, with the ratios against float32; then the same model trained in this process with no parameter server
// (tests/bench/one_process_training.h), and fp32's ratio to it. Needs root.
//
//   bazel run -c opt //tests/bench:netsim_training_bench -- [--rate=1gbit] [--epochs=1]
//       [--hidden=512,256] [--batch=128] [--optimizer=momentum|sgd] [--consistency=bsp|ssp:N]
//       [--variants=topk1,topk1-both] [--cpu_threads=N] [--out=FILE]                 (as root)
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "scheduler/job_yaml.h"
#include "tests/bench/one_process_training.h"
#include "tests/netsim/netsim_cluster.h"
#include "worker/data/fashion_mnist.h"

ABSL_FLAG(std::string, rate, "1gbit", "every host's link rate");
ABSL_FLAG(int, epochs, 1, "epochs per job");
ABSL_FLAG(std::string, hidden, "512,256", "the MLP's hidden widths");
ABSL_FLAG(int, batch, 128, "batch size");
ABSL_FLAG(std::string, out, "", "also write the report (markdown) to this file");
ABSL_FLAG(std::string, optimizer, "momentum",
          "the job's optimizer: momentum (SGD 0.05 with momentum 0.9) or sgd (plain SGD 0.1: "
          "its sparse updates leave the pulls' top-k nothing owed)");
ABSL_FLAG(std::string, consistency, "bsp",
          "the job's consistency: bsp, or ssp:N (N >= 1: the worker pulls step n+1's weights "
          "while it computes step n and pushes step n while it computes step n+1)");
ABSL_FLAG(int, cpu_threads, 1,
          "compute threads of the worker's CPU backend and of the one-process run alike: 1 = "
          "the worker's host has one of this machine's cores for its model and the server's "
          "host the other, as separate hosts would; 0 = every core for both (then the worker's "
          "threads share the cores with the server's host and both network stacks)");
ABSL_FLAG(std::string, variants, "",
          "comma-separated names of the compressions to run after fp32 (empty: all)");

namespace pscluster::testing {
namespace {

struct Variant {
  const char* name;
  const char* compression;  // table_compression's "*" entry; "" = float32.
};

struct Result {
  double samples_per_sec = 0;
  double test_accuracy = -1;
  std::string error;
};

// --consistency (or `c`) as the job file's consistency section ("" when malformed).
std::string ConsistencyYaml(std::string c = absl::GetFlag(FLAGS_consistency)) {
  if (c == "bsp") return "  mode: bsp\n";
  int s = 0;
  if (c.rfind("ssp:", 0) == 0 && absl::SimpleAtoi(c.substr(4), &s) && s >= 1) {
    return absl::StrCat("  mode: ssp\n  staleness: ", s, "\n");
  }
  return "";
}

std::string JobYaml(const std::string& name, const Variant& v, bool bsp = false) {
  std::string yaml = absl::StrCat(
      "name: ", name, "\nmodel:\n  kind: mlp\n  hidden: [", absl::GetFlag(FLAGS_hidden),
      "]\ndataset:\n  name: fashion_mnist\noptimizer:\n",
      absl::GetFlag(FLAGS_optimizer) == "sgd"
          ? "  kind: sgd\n  learning_rate: 0.1\n"
          : "  kind: momentum\n  learning_rate: 0.05\n  momentum: 0.9\n",
      "consistency:\n", bsp ? ConsistencyYaml("bsp") : ConsistencyYaml(), "num_servers: 1\nnum_workers: 1\n"
      "gpus_per_worker: 0\ndevice: cpu\nepochs: ", absl::GetFlag(FLAGS_epochs),
      "\nbatch_size: ", absl::GetFlag(FLAGS_batch),
      "\neval_batch_size: 1000\nnum_virtual_shards: 16\nseed: 7\n");
  if (*v.compression) absl::StrAppend(&yaml, "table_compression:\n  \"*\": ", v.compression, "\n");
  return yaml;
}

Result RunJob(NetsimCluster& c, int index, const Variant& v, bool bsp = false) {
  Result r;
  const std::string name = absl::StrCat("bench-", v.name, bsp ? "-bsp" : "");
  CommandResult submit =
      c.Psctl({"submit", c.WriteFile(absl::StrCat(name, ".yaml"), JobYaml(name, v, bsp))});
  if (submit.exit_code != 0) {
    r.error = submit.output;
    return r;
  }
  const std::string id = absl::StrCat("job-", index);
  int64_t first_step = -1, last_step = -1;
  absl::Time first_at, last_at;
  const absl::Time deadline = absl::Now() + absl::Minutes(30);
  while (absl::Now() < deadline) {
    auto j = c.GetJob(id);
    const absl::Time now = absl::Now();
    if (j.ok()) {
      const int64_t step = j->progress().step();
      if (j->state() == v1::JOB_RUNNING && step > 0 && step < j->progress().total_steps()) {
        if (first_step < 0) {
          first_step = step;
          first_at = now;
        }
        last_step = step;
        last_at = now;
      }
      if (j->state() == v1::JOB_SUCCEEDED || j->state() == v1::JOB_FAILED ||
          j->state() == v1::JOB_CANCELLED) {
        if (j->state() != v1::JOB_SUCCEEDED) r.error = j->reason();
        r.test_accuracy = j->progress().test_accuracy();
        break;
      }
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  if (last_step > first_step) {
    r.samples_per_sec = static_cast<double>(last_step - first_step) *
                        absl::GetFlag(FLAGS_batch) / absl::ToDoubleSeconds(last_at - first_at);
  } else if (r.error.empty()) {
    r.error = "too few progress reports to measure";
  }
  return r;
}

int Main() {
  if (absl::GetFlag(FLAGS_optimizer) != "sgd" && absl::GetFlag(FLAGS_optimizer) != "momentum") {
    std::fprintf(stderr, "--optimizer: momentum or sgd, got '%s'\n",
                 absl::GetFlag(FLAGS_optimizer).c_str());
    return 2;
  }
  if (ConsistencyYaml().empty()) {
    std::fprintf(stderr, "--consistency: bsp or ssp:N with N >= 1, got '%s'\n",
                 absl::GetFlag(FLAGS_consistency).c_str());
    return 2;
  }
  NetsimClusterOptions o;
  o.servers = 1;
  o.workers = 1;
  o.rate = absl::GetFlag(FLAGS_rate);
  // The worker computes with as many threads as the one-process run below (the cluster's
  // default for its workers is one).
  o.worker_args.push_back(absl::StrCat("--cpu_threads=", absl::GetFlag(FLAGS_cpu_threads)));
  auto cluster = NetsimCluster::Start("netsim_training_bench", o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "cannot start the network: %s\n", cluster.status().ToString().c_str());
    return IsUnsupported(cluster.status()) ? 0 : 1;
  }
  const Variant variants[] = {
      {"fp32", ""},
      {"fp16", "{transport: fp16}"},
      {"topk1", "{topk_ratio: 0.01}"},
      {"int8", "{quantize: int8}"},
      // Top-k pushes in fp16 and fp16 pulls: the pull of the whole model, which the top-k row
      // sends in float32, halves too.
      {"topk1-fp16", "{topk_ratio: 0.01, transport: fp16}"},
      // Top-k both ways: the pulls send only the 1% of each block that moved most since the
      // worker's copy (the server keeps what it owes), the pushes the largest 1%.
      {"topk1-both", "{topk_ratio: 0.01, pull_topk_ratio: 0.01}"},
      {"topk1-both-fp16", "{topk_ratio: 0.01, pull_topk_ratio: 0.01, transport: fp16}"},
      {"topk1-pull5-fp16", "{topk_ratio: 0.01, pull_topk_ratio: 0.05, transport: fp16}"},
  };
  const std::vector<std::string> wanted =
      absl::StrSplit(absl::GetFlag(FLAGS_variants), ',', absl::SkipEmpty());
  std::string report = absl::StrFormat(
      "Fashion-MNIST MLP (hidden %s, batch %d, %d epoch(s), %s, %s), 1 server x 1 worker, "
      "links %s, %d compute thread(s) in the worker and in one process (0 = every core)\n\n| compression | samples/s | vs fp32 | test accuracy |\n|---|---|---|---|\n",
      absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_epochs),
      absl::GetFlag(FLAGS_optimizer) == "sgd" ? "SGD 0.1" : "momentum SGD",
      absl::GetFlag(FLAGS_consistency), o.rate, absl::GetFlag(FLAGS_cpu_threads));
  double base = 0;
  int index = 1;
  for (const Variant& v : variants) {
    if (base != 0 && !wanted.empty() &&
        std::find(wanted.begin(), wanted.end(), v.name) == wanted.end()) {
      continue;
    }
    Result r = RunJob(**cluster, index++, v);
    if (!r.error.empty()) {
      std::fprintf(stderr, "%s: %s\n%s\n", v.name, r.error.c_str(),
                   (*cluster)->LogTails().c_str());
      return 1;
    }
    if (base == 0) base = r.samples_per_sec;
    absl::StrAppendFormat(&report, "| %s | %.0f | %.2fx | %.4f |\n", v.name, r.samples_per_sec,
                          r.samples_per_sec / base, r.test_accuracy);
    std::fprintf(stderr, "%s: %.0f samples/s, test accuracy %.4f\n", v.name, r.samples_per_sec,
                 r.test_accuracy);
  }
  if (absl::GetFlag(FLAGS_consistency) != "bsp") {
    // The float32 job under BSP too, for reference: SSP's overlap gains little where the link
    // is the limit, and its stale reads may cost accuracy.
    Result r = RunJob(**cluster, index++, variants[0], /*bsp=*/true);
    if (!r.error.empty()) {
      std::fprintf(stderr, "fp32 (bsp): %s\n", r.error.c_str());
      return 1;
    }
    absl::StrAppendFormat(&report, "| fp32 (bsp) | %.0f | %.2fx | %.4f |\n", r.samples_per_sec,
                          r.samples_per_sec / base, r.test_accuracy);
  }
  // The same job's model trained in this process, with no parameter server and no network (the
  // CPU backend with --cpu_threads, as the worker's), after the cluster's runs.
  auto spec = scheduler::LoadJobYaml(JobYaml("one-process", variants[0]), "netsim_training_bench");
  auto fm = spec.ok() ? data::LoadFashionMnist("") : absl::StatusOr<data::FashionMnist>(spec.status());
  auto one = fm.ok() ? bench::TrainInOneProcess(*spec, *fm, absl::GetFlag(FLAGS_cpu_threads))
                     : absl::StatusOr<bench::OneProcessResult>(fm.status());
  if (!one.ok()) {
    std::fprintf(stderr, "one process: %s\n", one.status().ToString().c_str());
    return 1;
  }
  absl::StrAppendFormat(&report, "| one process (no PS, no network) | %.0f | %.2fx | %.4f |\n",
                        one->samples_per_sec, one->samples_per_sec / base, one->test_accuracy);
  absl::StrAppendFormat(&report,
                        "\nfp32 through 1 server x 1 worker over %s links / one process: %.2f\n",
                        o.rate, base / one->samples_per_sec);
  std::printf("%s", report.c_str());
  if (!absl::GetFlag(FLAGS_out).empty()) {
    absl::Status st = WriteFileAtomically(absl::GetFlag(FLAGS_out), report);
    if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str());
  }
  return 0;
}

}  // namespace
}  // namespace pscluster::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // The cluster finds the daemons in the runfiles and keeps its files under a scratch
  // directory, as under `bazel test`; `bazel run` sets neither.
  if (std::getenv("TEST_SRCDIR") == nullptr) {
    const char* rf = std::getenv("RUNFILES_DIR");
    const std::string runfiles = rf != nullptr ? rf : std::string(argv[0]) + ".runfiles";
    setenv("TEST_SRCDIR", runfiles.c_str(), 1);
  }
  if (std::getenv("TEST_TMPDIR") == nullptr) {
    const std::string tmp = absl::StrCat("/tmp/netsim_training_bench.", getpid());
    if (!pscluster::MakeDirs(tmp).ok()) return 1;
    setenv("TEST_TMPDIR", tmp.c_str(), 1);
  }
  return pscluster::testing::Main();
}
