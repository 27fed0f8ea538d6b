// DLRM through a parameter server against the same model trained in one process with no
// parameter server, measured in the same run.
//
//   dlrm_bench [--train_examples=200000] [--epochs=1] [--batch=256] [--repeats=1]
//              [--server_bin=PATH] [--gen_bin=PATH] [--job=PATH]
//
// Data: a planted click-through set in Criteo's format (tests/data/gen_ctr_data, the flags of
// tests/cluster/ctr_training_test), written once into a temporary directory.
// Model: deploy/examples/ctr_dlrm.yaml (a bottom MLP, 26 embedded fields, dot interactions, a top
// MLP, a wide part), with its table_embedding settings left out: the one-process row has no
// admission or expiry, so neither row has them.
// Rows, each the same worker Trainer with the CPU backend:
//   one process     its parameters in this process (FakeParamClient: the servers' initializers
//                   and update rules applied in place; no network, no server)
//   1 server x 1    a real ps_server process on loopback, over its TCP data port
// The ratio divides each row's samples/s by the one-process rate of the same repeat; the table
// shows medians over the repeats, and each row's test AUC (the same data, model and seed).
#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "scheduler/job_yaml.h"
#include "server/client/testing/fake_param_client.h"
#include "tests/bench/ps_bench_process.h"
#include "worker/standalone.h"
#include "worker/trainer.h"

ABSL_FLAG(uint64_t, train_examples, 200000, "training examples of the generated set");
ABSL_FLAG(uint64_t, test_examples, 20000, "test examples of the generated set");
ABSL_FLAG(int, epochs, 1, "epochs per measured run");
ABSL_FLAG(int, batch, 256, "examples per step");
ABSL_FLAG(int, repeats, 1, "measure every row this many times, interleaved; medians are shown");
ABSL_FLAG(int, cpu_threads, 0, "CPU backend threads (0 = all cores)");
ABSL_FLAG(std::string, server_bin, "", "ps_server binary (default: from the runfiles)");
ABSL_FLAG(std::string, gen_bin, "", "gen_ctr_data binary (default: from the runfiles)");
ABSL_FLAG(std::string, job, "", "the DLRM job file (default: deploy/examples/ctr_dlrm.yaml)");
ABSL_FLAG(bool, keep_data, false, "keep the generated set (its directory is printed)");

namespace pscluster {
namespace {

std::string Runfile(const char* argv0, const std::string& rel) {
  const char* dir = std::getenv("RUNFILES_DIR");
  const std::string base = dir ? std::string(dir) : std::string(argv0) + ".runfiles";
  return base + "/pscluster/" + rel;
}

struct Row {
  double samples_per_sec = 0;
  double auc = -1;
  int64_t steps = 0;
};

// Collects nothing; the task never has to stop.
class Sink final : public worker::ProgressSink {
 public:
  bool Report(const v1::WorkerProgress&) override { return true; }
  absl::StatusOr<v1::ShardMap> RefreshShardMap() override {
    return absl::UnavailableError("no scheduler in this benchmark");
  }
};

// Trains `spec` once as rank 0 of 1 against `servers` (none: against a FakeParamClient).
absl::StatusOr<Row> Train(const v1::JobSpec& spec, const std::vector<std::string>& servers,
                          const std::string& job_id) {
  v1::AssignTaskRequest task;
  task.set_job_id(job_id);
  *task.mutable_spec() = spec;
  task.set_rank(0);
  task.set_num_workers(1);
  worker::TrainerOptions to;
  to.device = "cpu";
  to.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  to.eval_every_epoch = false;
  to.data_transport = DataTransport::kTcp;
  if (servers.empty()) {
    task.mutable_shard_map()->set_job_id(job_id);
    task.mutable_shard_map()->set_epoch(1);
    auto store = std::make_shared<FakeParameterStore>();
    to.param_client_factory = [store](const PsClientOptions& o, const v1::ShardMap& map,
                                      const std::vector<v1::TableSpec>& tables)
        -> absl::StatusOr<std::unique_ptr<ParamClient>> {
      return std::make_unique<FakeParamClient>(store, o.worker, map, tables);
    };
  } else {
    auto map = worker::RoundRobinShardMap(job_id, servers, 64);
    if (!map.ok()) return map.status();
    *task.mutable_shard_map() = *map;
    to.install_shard_map = true;
  }
  Sink sink;
  auto trainer = worker::Trainer::Create(task, to, &sink);
  if (!trainer.ok()) return trainer.status();
  absl::Status ran = (*trainer)->Run();
  if (!ran.ok()) return ran;
  const worker::TrainerResult r = (*trainer)->result();
  return Row{r.samples_per_sec, r.test_auc, r.steps};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  absl::ParseCommandLine(argc, argv);
  DisableMutexDeadlockDetection();
  SetLogLevel("warn").IgnoreError();
  auto bin = [&](const std::string& flag, const std::string& rel) {
    return flag.empty() ? Runfile(argv[0], rel) : flag;
  };
  const std::string server_bin = bin(absl::GetFlag(FLAGS_server_bin), "server/ps_server");
  const std::string gen_bin = bin(absl::GetFlag(FLAGS_gen_bin), "tests/data/gen_ctr_data");
  const std::string job_file = bin(absl::GetFlag(FLAGS_job), "deploy/examples/ctr_dlrm.yaml");

  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/dlrm_bench.XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "mkdtemp %s: %s\n", tmpl.c_str(), std::strerror(errno));
    return 1;
  }
  const std::string dir = tmpl;
  // The generated set goes when the run ends (unless --keep_data).
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      if (!absl::GetFlag(FLAGS_keep_data)) std::filesystem::remove_all(dir);
    }
  } cleanup{dir};
  std::fprintf(stderr, "writing %llu training examples into %s...\n",
               static_cast<unsigned long long>(absl::GetFlag(FLAGS_train_examples)),
               dir.c_str());
  const std::string gen = absl::StrCat(
      gen_bin, " --out_dir=", dir, " --train_examples=", absl::GetFlag(FLAGS_train_examples),
      " --test_examples=", absl::GetFlag(FLAGS_test_examples),
      " --keys=1000000 --zipf=1.4 --signal_ranks=20 --weight_scale=0.6 --factor_scale=0.15"
      " >/dev/null");
  if (std::system(gen.c_str()) != 0) {
    std::fprintf(stderr, "--gen_bin: %s failed\n", gen.c_str());
    return 1;
  }
  auto text = ReadFile(job_file);
  if (!text.ok()) {
    std::fprintf(stderr, "--job: %s\n", text.status().ToString().c_str());
    return 1;
  }
  auto loaded = scheduler::LoadJobYaml(*text, job_file);
  if (!loaded.ok()) {
    std::fprintf(stderr, "--job: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  v1::JobSpec spec = *loaded;
  spec.clear_table_embedding();
  spec.set_export_path("");
  spec.set_checkpoint_dir("");
  spec.set_num_servers(1);
  spec.set_num_workers(1);
  spec.set_epochs(absl::GetFlag(FLAGS_epochs));
  spec.set_batch_size(absl::GetFlag(FLAGS_batch));
  spec.mutable_dataset()->set_train(dir + "/train.txt");
  spec.mutable_dataset()->set_test(dir + "/test.txt");

  bench::ChildProcess server(server_bin, {"--listen=127.0.0.1:0", "--log_level=warn"},
                             dir + "/port");
  auto address = server.Address();
  if (!address.ok()) {
    std::fprintf(stderr, "--server_bin: %s\n", address.status().ToString().c_str());
    return 1;
  }

  const std::string job_name = absl::GetFlag(FLAGS_job).empty()
                                   ? std::string("deploy/examples/ctr_dlrm.yaml")
                                   : absl::GetFlag(FLAGS_job);
  std::printf("DLRM (%s) on %llu planted click-through examples, batch %d, %d epoch(s) per run, "
              "CPU backend, %u cores\n",
              job_name.c_str(), static_cast<unsigned long long>(absl::GetFlag(FLAGS_train_examples)),
              absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_epochs),
              std::thread::hardware_concurrency());
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::vector<double> single_rate, cluster_rate, ratios, single_auc, cluster_auc;
  for (int rep = 0; rep < repeats; ++rep) {
    std::fprintf(stderr, "repeat %d/%d: training in one process...\n", rep + 1, repeats);
    auto single = Train(spec, {}, absl::StrCat("dlrm-single-", rep));
    if (!single.ok()) {
      std::fprintf(stderr, "one process: %s\n", single.status().ToString().c_str());
      return 1;
    }
    std::fprintf(stderr, "repeat %d/%d: training through 1 server...\n", rep + 1, repeats);
    auto cluster = Train(spec, {*address}, absl::StrCat("dlrm-cluster-", rep));
    if (!cluster.ok()) {
      std::fprintf(stderr, "1 server x 1 worker: %s\n", cluster.status().ToString().c_str());
      return 1;
    }
    if (single->steps != cluster->steps) {
      std::fprintf(stderr, "the rows ran %lld and %lld steps\n",
                   static_cast<long long>(single->steps), static_cast<long long>(cluster->steps));
      return 1;
    }
    single_rate.push_back(single->samples_per_sec);
    cluster_rate.push_back(cluster->samples_per_sec);
    ratios.push_back(cluster->samples_per_sec / single->samples_per_sec);
    single_auc.push_back(single->auc);
    cluster_auc.push_back(cluster->auc);
    std::fprintf(stderr, "  one process %.0f samples/s, 1 server x 1 %.0f samples/s (%.2f)\n",
                 single->samples_per_sec, cluster->samples_per_sec, ratios.back());
  }
  std::printf("| row | samples/s | ratio to one process | test AUC |\n|---|---|---|---|\n");
  std::printf("| one process, no parameter server | %.0f | 1.00 | %.4f |\n", Median(single_rate),
              Median(single_auc));
  std::printf("| 1 server x 1 worker (BSP, TCP data port) | %.0f | %.2f | %.4f |\n",
              Median(cluster_rate), Median(ratios), Median(cluster_auc));
  auto planted = ReadFile(dir + "/planted.txt");
  if (planted.ok()) std::printf("planted model: %s", planted->c_str());
  std::printf("ratios per repeat:");
  for (double r : ratios) std::printf(" %.2f", r);
  std::printf("\n");
  return 0;
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) { return pscluster::Main(argc, argv); }
