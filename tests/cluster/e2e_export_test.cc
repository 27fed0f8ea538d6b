// End to end with the real daemons: `psctl export JOB [--to PATH]` on a running Fashion-MNIST job
// writes the model as the servers hold it, as a safetensors file of the whole model, while the job
// trains on; a path the lead worker cannot write is refused naming it.
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/testing/wait_for.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/cluster/e2e_cluster.h"

namespace pscluster::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

TEST(E2eExportTest, ARunningJobIsExportedOnDemandAndTrainsOn) {
  auto cluster = E2eCluster::Start("export");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  const std::string at_end = c.dir() + "/at-end.safetensors";
  CommandResult submit =
      c.Psctl({"submit", c.WriteFile("job.yaml", FashionJobYaml("exported", 200, at_end))});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  v1::Job seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(60), [&] {
    auto j = c.GetJob("job-1");
    if (j.ok()) seen = *j;
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() >= 50;
  })) << seen.DebugString() << c.LogTails();

  // Into a directory that does not exist yet: the worker creates it.
  const std::string now = c.dir() + "/on-demand/now.safetensors";
  CommandResult r = c.Psctl({"export", "job-1", "--to=" + now, "-o", "json"}, absl::Seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.output << c.LogTails();
  v1::ExportJobResponse resp;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.output, &resp).ok()) << r.output;
  EXPECT_EQ(resp.path(), now);
  EXPECT_GE(resp.step(), 50);
  EXPECT_EQ(resp.worker(), seen.workers(0));
  auto file = SafetensorsFile::Read(now);
  ASSERT_TRUE(file.ok()) << file.status();
  struct stat st;
  ASSERT_EQ(stat(now.c_str(), &st), 0);
  EXPECT_EQ(resp.bytes(), static_cast<uint64_t>(st.st_size));
  ASSERT_THAT(file->entries(), SizeIs(4));
  const std::pair<const char*, std::vector<uint64_t>> tensors[] = {
      {"fc1/weight", {784, 64}}, {"fc1/bias", {64}}, {"out/weight", {64, 10}}, {"out/bias", {10}}};
  for (const auto& [name, shape] : tensors) {
    const SafetensorsFile::Entry* e = file->Find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->shape, shape) << name;
  }
  EXPECT_EQ(file->metadata().at("steps"), absl::StrCat(resp.step()));
  EXPECT_EQ(file->metadata().at("job_id"), "job-1");

  // The job trains on.
  ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
    auto j = c.GetJob("job-1");
    return j.ok() && j->state() == v1::JOB_RUNNING && j->progress().step() > resp.step() + 20;
  })) << c.LogTails();

  // The default path is the job's export_path; a path the worker cannot write is named.
  r = c.Psctl({"export", "job-1"}, absl::Seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("exported to ", at_end)));
  r = c.Psctl({"export", "job-1", "--to=/proc/no-such-dir/m.safetensors"}, absl::Seconds(60));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("/proc/no-such-dir"));
  EXPECT_EQ(c.Psctl({"cancel", "job-1"}).exit_code, 0);
}

// A layer graph over the user's LibSVM files (logistic regression: categorical_input -> linear
// -> sigmoid), trained by two workers over two servers with an export_path: the file holds the
// wide part's table at exactly the keys the training file's lines use (their 1-based indices
// less one), listed from both servers with the job's data proof, each key once and in order,
// and none that only the test file has (reads create no rows).
TEST(E2eExportTest, AGraphJobIsExportedAtExactlyTheKeysItsTrainingLinesUse) {
  auto cluster = E2eCluster::Start("export-graph");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  E2eCluster& c = **cluster;
  std::string train, test;
  std::set<uint64_t> train_keys;
  for (int i = 0; i < 400; ++i) {
    // Two even indices in 2..60 per line, increasing; the label follows index 2.
    const int a = 2 * (1 + i % 30), b = 2 * (1 + (i * 7 + 3) % 30);
    const int lo = std::min(a, b), hi = a == b ? a + 2 : std::max(a, b);
    absl::StrAppend(&train, (lo == 2 || i % 5 == 0) ? 1 : 0, " ", lo, ":1 ", hi, ":1\n");
    train_keys.insert(lo - 1);
    train_keys.insert(hi - 1);
  }
  // The test lines also use odd indices, which no training line has.
  for (int i = 0; i < 100; ++i) {
    absl::StrAppend(&test, i % 2, " ", 2 * (1 + i % 30), ":1 ", 63 + 2 * (i % 5), ":1\n");
  }
  const std::string export_path = c.dir() + "/graph/lr.safetensors";
  const std::string job = absl::StrCat(R"(name: graph-export
model:
  kind: graph
  layers:
    - {name: keys, type: categorical_input}
    - {name: wide, type: linear, inputs: [keys]}
    - {name: head, type: sigmoid, inputs: [wide]}
dataset:
  format: libsvm
  train: )", c.WriteFile("train.svm", train), R"(
  test: )", c.WriteFile("test.svm", test), R"(
optimizer: {kind: adagrad, learning_rate: 0.1}
consistency: {mode: bsp}
num_servers: 2
num_workers: 2
epochs: 2
batch_size: 20
export_path: )", export_path, "\n");
  CommandResult submit =
      c.Psctl({"submit", c.WriteFile("graph.yaml", job), "--wait"}, absl::Seconds(120));
  ASSERT_EQ(submit.exit_code, 0) << submit.output << c.LogTails();
  auto done = c.GetJob("job-1");
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_SUCCEEDED) << done->reason();
  EXPECT_EQ(done->export_path(), export_path);
  auto file = SafetensorsFile::Read(export_path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile::Entry* keys = file->Find("wide/weight.keys");
  ASSERT_NE(keys, nullptr);
  std::vector<uint64_t> exported(file->Data(*keys).size() / sizeof(uint64_t));
  std::memcpy(exported.data(), file->Data(*keys).data(), exported.size() * sizeof(uint64_t));
  EXPECT_EQ(exported, std::vector<uint64_t>(train_keys.begin(), train_keys.end()));
  const SafetensorsFile::Entry* rows = file->Find("wide/weight");
  ASSERT_NE(rows, nullptr);
  EXPECT_EQ(rows->shape, (std::vector<uint64_t>{train_keys.size(), 1}));
  ASSERT_NE(file->Find("wide/bias"), nullptr);
  EXPECT_EQ(file->metadata().at("model"), "graph");
}

}  // namespace
}  // namespace pscluster::testing
