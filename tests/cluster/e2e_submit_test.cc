// End to end with the real daemons: `psctl submit FILE --wait` against a cluster of ps_scheduler,
// 2 ps_server and 2 ps_worker processes trains a short Fashion-MNIST job to the end; the result
// (state, test accuracy, exported model) is read back through `psctl status JOB -o json`.
// Malformed and oversized jobs get clear errors from psctl and change nothing.
#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/e2e_cluster.h"

namespace pscluster::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

TEST(E2eSubmitTest, SubmitWaitTrainsToTheEndAndStatusJsonReportsIt) {
  auto cluster = E2eCluster::Start("submit");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  // (Into an existing directory: ps_worker does not create a missing parent directory.)
  const std::string model = c.dir() + "/e2e-mlp.safetensors";
  std::string job = c.WriteFile("job.yaml", FashionJobYaml("e2e-mlp", 1, model));

  CommandResult submit = c.Psctl({"submit", job, "--wait"}, absl::Seconds(80));
  ASSERT_EQ(submit.exit_code, 0) << submit.output << c.LogTails();
  std::vector<std::string> lines = absl::StrSplit(submit.output, '\n');
  const std::string id = lines[0];
  EXPECT_EQ(id, "job-1");
  EXPECT_THAT(submit.output, HasSubstr("job-1 succeeded"));
  EXPECT_THAT(submit.output, HasSubstr(absl::StrCat("model exported to ", model)));

  auto parsed = c.JobViaPsctl(id);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::Job& done = *parsed;
  EXPECT_EQ(done.job_id(), id);
  EXPECT_EQ(done.state(), v1::JOB_SUCCEEDED) << done.reason();
  // One epoch of a 64-unit MLP: well above logistic regression's first epoch.
  EXPECT_GE(done.progress().test_accuracy(), 0.80);
  EXPECT_LE(done.progress().test_accuracy(), 1.0);
  EXPECT_GT(done.progress().test_loss(), 0);
  EXPECT_THAT(submit.output,
              HasSubstr(absl::StrFormat("test accuracy %.4f", done.progress().test_accuracy())));
  // Every rank ran every step of its partition (60,000 / 2 / 100 = 300) and reported done.
  ASSERT_THAT(done.progress().workers(), SizeIs(2));
  for (const v1::WorkerProgress& w : done.progress().workers()) {
    EXPECT_TRUE(w.done()) << w.rank();
    EXPECT_EQ(w.step(), 300) << w.rank();
    EXPECT_EQ(w.total_steps(), 300) << w.rank();
    EXPECT_EQ(w.examples(), 30000u) << w.rank();
  }
  EXPECT_EQ(done.progress().step(), 300);
  EXPECT_EQ(done.progress().epoch(), 1u);
  // A finished job waits for no one.
  EXPECT_THAT(done.progress().waiting_for(), IsEmpty());
  CommandResult table = c.Psctl({"status", id});
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(table.output, Not(HasSubstr("waiting for")));
  EXPECT_THAT(table.output, HasSubstr("succeeded"));

  // The export is a valid safetensors file holding the whole model: 784-64-10.
  EXPECT_EQ(done.export_path(), model);
  struct stat st;
  ASSERT_EQ(stat(model.c_str(), &st), 0) << model;
  auto file = SafetensorsFile::Read(model);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_THAT(file->entries(), SizeIs(4));
  const std::pair<const char*, std::vector<uint64_t>> tensors[] = {
      {"fc1/weight", {784, 64}}, {"fc1/bias", {64}}, {"out/weight", {64, 10}}, {"out/bias", {10}}};
  for (const auto& [name, shape] : tensors) {
    const SafetensorsFile::Entry* e = file->Find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->dtype, v1::DT_FLOAT32) << name;
    EXPECT_EQ(e->shape, shape) << name;
  }
  // Trained, not the initial values: the output bias (initialised to zero) has moved.
  absl::string_view bias = file->Data(*file->Find("out/bias"));
  const float* b = reinterpret_cast<const float*>(bias.data());
  bool moved = false;
  for (int i = 0; i < 10; ++i) moved = moved || b[i] != 0.0f;
  EXPECT_TRUE(moved);
  EXPECT_EQ(file->metadata().at("job_id"), id);

  // The workers are idle again and the scheduler lists one job.
  for (const char* w : {"worker-1", "worker-2"}) {
    EXPECT_TRUE(WaitFor(absl::Seconds(10), [&] {
      auto s = c.WorkerStatus(w);
      return s.ok() && !s->busy();
    })) << w;
  }
  auto jobs = c.Psctl({"jobs"});
  EXPECT_EQ(jobs.exit_code, 0);
  EXPECT_THAT(jobs.output, HasSubstr("job-1"));
}

TEST(E2eSubmitTest, MalformedAndOversizedJobsGetClearErrorsAndChangeNothing) {
  auto cluster = E2eCluster::Start("bad_jobs");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string good = FashionJobYaml("bad-jobs", 1, "");

  // A misspelt key: the file, line and field, with a suggestion.
  std::string typo = c.WriteFile(
      "typo.yaml", absl::StrReplaceAll(good, {{"  hidden: [64]", "  hiden: [64]"}}));
  CommandResult r = c.Psctl({"submit", typo, "--wait"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("psctl: ", typo,
                                               ":4: model.hiden: unknown field (did you mean "
                                               "'hidden'?)")));

  // A value of the wrong type and one out of range.
  std::string type = c.WriteFile(
      "type.yaml", absl::StrReplaceAll(good, {{"epochs: 1", "epochs: lots"}}));
  r = c.Psctl({"submit", type});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat(type, ":16: epochs:")));
  EXPECT_THAT(r.output, HasSubstr("lots"));
  std::string range = c.WriteFile(
      "range.yaml", absl::StrReplaceAll(good, {{"batch_size: 100", "batch_size: 0"}}));
  r = c.Psctl({"submit", range});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat(range, ":17: batch_size:")));

  // Not YAML at all.
  std::string broken = c.WriteFile("broken.yaml", "name: [unclosed\nepochs: 1\n");
  r = c.Psctl({"submit", broken});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr(broken));

  // A file that does not exist.
  r = c.Psctl({"submit", c.dir() + "/missing.yaml"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr(c.dir() + "/missing.yaml"));

  // More workers (or servers) than the cluster has: the shortage and who is there.
  std::string big = c.WriteFile(
      "big.yaml", absl::StrReplaceAll(good, {{"num_workers: 2", "num_workers: 5"}}));
  r = c.Psctl({"submit", big, "--wait"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat(
                            "psctl: ", big,
                            ": num_workers: the job asks for 5 workers but the cluster has 2 "
                            "live (worker-1, worker-2); start more ps_worker daemons or lower "
                            "num_workers")));
  std::string servers = c.WriteFile(
      "servers.yaml", absl::StrReplaceAll(good, {{"num_servers: 2", "num_servers: 3"}}));
  r = c.Psctl({"submit", servers});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("num_servers: the job asks for 3 servers but the cluster has 2 "
                                  "live (server-1, server-2)"));
  // GPUs the CPU workers do not have.
  std::string gpus = c.WriteFile(
      "gpus.yaml", absl::StrReplaceAll(good, {{"gpus_per_worker: 0", "gpus_per_worker: 1"},
                                              {"device: cpu", "device: cuda"}}));
  r = c.Psctl({"submit", gpus});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("num_workers: the job asks for 2 workers with >= 1 GPUs but "
                                  "the cluster has 0 live"));

  // Nothing was queued and every daemon is still up.
  CommandResult jobs = c.Psctl({"jobs", "-o", "json"});
  ASSERT_EQ(jobs.exit_code, 0) << jobs.output;
  EXPECT_THAT(jobs.output, Not(HasSubstr("job_id")));
  EXPECT_TRUE(c.processes().CheckAlive().ok()) << c.processes().CheckAlive();
  auto status = c.ClusterStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_THAT(status->jobs(), IsEmpty());
  EXPECT_THAT(status->nodes(), SizeIs(4));
}

}  // namespace
}  // namespace pscluster::testing
