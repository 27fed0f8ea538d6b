// LocalClusterSuite: a real local cluster (ps_scheduler, 2 ps_server and 2 ps_worker processes,
// CPU backend, loopback; psctl's LocalCluster) started once per test suite, with the helpers the
// training tests share: the example jobs of deploy/examples/ with their outputs moved into the
// test's directory, submitting a job and waiting for its end, and the planted click-through sets
// of tests/data:gen_ctr_data.
#ifndef PSCLUSTER_TESTS_CLUSTER_LOCAL_CLUSTER_SUITE_H_
#define PSCLUSTER_TESTS_CLUSTER_LOCAL_CLUSTER_SUITE_H_

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "scheduler/job_yaml.h"
#include "scheduler/psctl/client.h"
#include "scheduler/psctl/local_cluster.h"
#include "tests/cluster/scheduler_cluster_fixture.h"

namespace pscluster::testing {

class LocalClusterSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(std::getenv("TEST_TMPDIR"), "/cluster"));
    psctl::LocalClusterOptions o;
    o.scheduler_bin = Runfile("scheduler/ps_scheduler");
    o.server_bin = Runfile("server/ps_server");
    o.worker_bin = Runfile("worker/ps_worker");
    o.work_dir = *dir_;
    o.log_level = "warn";
    std::ostringstream progress;
    auto cluster = psctl::LocalCluster::Start(o, progress);
    ASSERT_TRUE(cluster.ok()) << cluster.status() << "\n" << progress.str();
    cluster_ = cluster->release();
    psctl::ClientOptions co;
    co.address = cluster_->scheduler_address();
    auto client = psctl::SchedulerClient::Connect(co);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = client->release();
  }
  static void TearDownTestSuite() {
    delete client_;
    client_ = nullptr;
    if (cluster_ != nullptr) cluster_->Stop();
    delete cluster_;
    cluster_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }

  // Loads deploy/examples/NAME.yaml with its export path and checkpoint directory moved under
  // the test's directory.
  static v1::JobSpec Example(const std::string& name) {
    std::string file = Runfile(absl::StrCat("deploy/examples/", name, ".yaml"));
    auto text = ReadFile(file);
    EXPECT_TRUE(text.ok()) << text.status();
    auto spec = scheduler::LoadJobYaml(text.ok() ? *text : "", file);
    EXPECT_TRUE(spec.ok()) << spec.status();
    v1::JobSpec s = spec.ok() ? *spec : v1::JobSpec();
    s.set_export_path(absl::StrCat(*dir_, "/models/", name, ".safetensors"));
    s.set_checkpoint_dir(absl::StrCat(*dir_, "/checkpoints/", name));
    return s;
  }

  // Submits `spec` and waits for a final state; returns the finished job.
  static v1::Job Run(const v1::JobSpec& spec, absl::Duration timeout = absl::Minutes(6)) {
    v1::SubmitJobRequest req;
    *req.mutable_job() = spec;
    auto sub = client_->SubmitJob(req);
    EXPECT_TRUE(sub.ok()) << sub.status();
    if (!sub.ok()) return {};
    absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      auto job = client_->GetJob(sub->job_id());
      EXPECT_TRUE(job.ok()) << job.status();
      if (!job.ok()) return {};
      // A final state (JOB_RECOVERING comes after them in the enum, and is not one: a job
      // that lost a node, or a shard move, rolls back and goes on).
      const v1::JobState state = job->state();
      if (state == v1::JOB_SUCCEEDED || state == v1::JOB_FAILED || state == v1::JOB_CANCELLED) {
        std::printf("%s (%s): %s, test accuracy %.4f, %lld steps, %.0f s\n", spec.name().c_str(),
                    sub->job_id().c_str(), v1::JobState_Name(job->state()).c_str(),
                    job->progress().test_accuracy(),
                    static_cast<long long>(job->progress().total_steps()),
                    (job->finished_unix_ms() - job->started_unix_ms()) / 1000.0);
        return *job;
      }
      absl::Status alive = cluster_->CheckAlive();
      EXPECT_TRUE(alive.ok()) << alive;
      if (!alive.ok()) return *job;
      absl::SleepFor(absl::Milliseconds(250));
    }
    ADD_FAILURE() << "job " << sub->job_id() << " did not finish in " << timeout;
    return {};
  }

  // Writes a planted click-through set (gen_ctr_data with `flags`) into <test dir>/<name>;
  // returns the directory and the planted model's own test AUC (the ceiling; -1 if unreadable).
  static std::pair<std::string, double> GenerateCtr(const std::string& name,
                                                    const std::string& flags) {
    const std::string out = absl::StrCat(*dir_, "/", name);
    const std::string cmd = absl::StrCat("mkdir -p ", out, " && ",
                                         Runfile("tests/data/gen_ctr_data"), " --out_dir=", out,
                                         " ", flags, " >/dev/null");
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto planted = ReadFile(out + "/planted.txt");
    EXPECT_TRUE(planted.ok()) << planted.status();
    const std::string key = "planted_test_auc: ";
    const size_t at = planted.ok() ? planted->find(key) : std::string::npos;
    EXPECT_NE(at, std::string::npos);
    return {out, at == std::string::npos ? -1 : std::atof(planted->c_str() + at + key.size())};
  }

  // `spec` (a Criteo-format example) pointed at the set in `data`, exporting nothing.
  static v1::JobSpec OnCtrData(v1::JobSpec spec, const std::string& data) {
    spec.set_export_path("");
    EXPECT_EQ(spec.dataset().format(), "criteo");
    spec.mutable_dataset()->set_train(data + "/train.txt");
    spec.mutable_dataset()->set_test(data + "/test.txt");
    return spec;
  }

  // The test AUC of a finished job: the evaluating rank's (-1: none).
  static double TestAuc(const v1::Job& job) {
    double auc = -1;
    for (const v1::WorkerProgress& w : job.progress().workers()) {
      if (!w.left() && w.test_accuracy() >= 0) auc = w.test_auc();
    }
    return auc;
  }

  inline static std::string* dir_ = nullptr;
  inline static psctl::LocalCluster* cluster_ = nullptr;
  inline static psctl::SchedulerClient* client_ = nullptr;
};

}  // namespace pscluster::testing

#endif  // PSCLUSTER_TESTS_CLUSTER_LOCAL_CLUSTER_SUITE_H_
