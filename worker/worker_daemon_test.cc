// The worker daemon in-process against a real scheduler daemon on loopback: it registers with
// its device and capacity, writes its port file, serves /metrics, and refuses bad options with
// the file or address at fault.
#include "worker/worker_daemon.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/channel.h"
#include "common/scheduler_term.h"
#include "common/testing/http_get.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait_for.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/worker.grpc.pb.h"
#include "scheduler/scheduler_daemon.h"

namespace pscluster::worker {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::WaitFor;
using ::testing::HasSubstr;

std::string TestDir() { return std::getenv("TEST_TMPDIR"); }

using ::pscluster::testing::HttpGet;

class WorkerDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    scheduler::SchedulerDaemonOptions so;
    so.listen_address = "127.0.0.1:0";
    so.db_path = absl::StrCat(TestDir(), "/", Name(), ".db");
    std::remove(so.db_path.c_str());
    so.db_full_sync = false;
    auto s = scheduler::SchedulerDaemon::Start(so);
    ASSERT_THAT(s.status(), IsOk());
    scheduler_ = std::move(*s);
  }
  static std::string Name() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  WorkerDaemonOptions Options() {
    WorkerDaemonOptions o;
    o.scheduler_address = scheduler_->address();
    o.cpu_slots = 2;
    o.memory_bytes = 3ull << 30;
    o.trainer.device = "cpu";
    return o;
  }

  std::unique_ptr<scheduler::SchedulerDaemon> scheduler_;
};

TEST_F(WorkerDaemonTest, RegistersWritesItsPortFileAndServesMetrics) {
  WorkerDaemonOptions o = Options();
  o.port_file = absl::StrCat(TestDir(), "/worker.port");
  o.metrics_address = "127.0.0.1:0";
  auto d = WorkerDaemon::Start(o);
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_EQ((*d)->device(), "cpu");

  auto port_file = ReadFile(o.port_file);
  ASSERT_THAT(port_file.status(), IsOk());
  EXPECT_EQ(*port_file, (*d)->address() + "\n");

  v1::NodeStatus seen;
  ASSERT_TRUE(WaitFor(absl::Seconds(20), [&] {
    for (const v1::NodeStatus& n : scheduler_->scheduler().registry().Snapshot()) {
      if (n.info().role() == v1::ROLE_WORKER && n.state() == v1::NODE_ALIVE) {
        seen = n;
        return true;
      }
    }
    return false;
  }));
  EXPECT_EQ(seen.info().address(), (*d)->address());
  EXPECT_EQ(seen.info().capacity().cpu_slots(), 2u);
  EXPECT_EQ(seen.info().capacity().gpus(), 0u);  // --device=cpu offers no GPU.
  EXPECT_EQ(seen.info().capacity().memory_bytes(), 3ull << 30);

  ASSERT_GT((*d)->metrics_port(), 0);
  const std::string metrics = HttpGet((*d)->metrics_port(), "/metrics");
  EXPECT_THAT(metrics, HasSubstr("pscluster_worker_busy 0"));
  EXPECT_THAT(metrics, HasSubstr("pscluster_worker_call_seconds"));
  (*d)->Shutdown();
  (*d)->Shutdown();  // Idempotent.
}

// A call from a scheduler of an older term than one already heard from (a deposed leader) is
// refused before it acts; the term and the refusals show in /metrics.
TEST_F(WorkerDaemonTest, RefusesTheCallsOfADeposedScheduler) {
  WorkerDaemonOptions o = Options();
  o.metrics_address = "127.0.0.1:0";
  auto d = WorkerDaemon::Start(o);
  ASSERT_THAT(d.status(), IsOk());
  auto channel = MakeChannel((*d)->address());
  ASSERT_THAT(channel.status(), IsOk());
  auto stub = v1::WorkerControl::NewStub(*channel);
  auto stop = [&](const std::string& term) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kSchedulerTermHeader, term);
    v1::StopTaskRequest req;
    req.set_job_id("no-such-job");
    v1::StopTaskResponse resp;
    return stub->StopTask(&ctx, req, &resp);
  };
  grpc::Status s = stop("41");
  EXPECT_NE(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  s = stop("40");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("pscluster.v1.WorkerControl.StopTask"));
  EXPECT_THAT(s.error_message(), HasSubstr("deposed scheduler (term 40)"));
  const std::string metrics = HttpGet((*d)->metrics_port(), "/metrics");
  EXPECT_THAT(metrics, HasSubstr("pscluster_worker_scheduler_term 41"));
  EXPECT_THAT(metrics, HasSubstr("pscluster_worker_deposed_scheduler_calls_total 1"));
  (*d)->Shutdown();
}

TEST_F(WorkerDaemonTest, BadOptionsNameWhatIsWrong) {
  WorkerDaemonOptions o = Options();
  o.token_file = absl::StrCat(TestDir(), "/no-such-tokens");
  auto d = WorkerDaemon::Start(o);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("no-such-tokens"));

  o = Options();
  o.metrics_address = "not an address";
  d = WorkerDaemon::Start(o);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("not an address"));
}

}  // namespace
}  // namespace pscluster::worker
