// Hostile control calls to the real ps_worker binary: AssignTask (with whole job specs filled at
// random), StopTask, UpdateShardMap and Status, every field random. The worker must answer each
// call with a status of its own, stay up, and stop cleanly on SIGTERM afterwards.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/grpc_server.h"
#include "common/testing/message_fuzzer.h"
#include "proto/scheduler.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "scheduler/job_yaml.h"
#include "server/testing/daemon.h"

namespace pscluster {
namespace {

// A task the worker accepts (its one server at a dead address, so it fails once it starts),
// then one part of it filled at random.
v1::AssignTaskRequest MostlyValidTask(testing::MessageFuzzer& fuzz) {
  v1::AssignTaskRequest t;
  t.set_job_id("job-1");
  *t.mutable_spec() = *scheduler::LoadJobYaml(testing::kFuzzJobYaml, "fuzz.yaml");
  t.set_rank(0);
  t.set_num_workers(1);
  t.mutable_partition()->set_count(1);
  v1::ShardMap* map = t.mutable_shard_map();
  map->set_job_id("job-1");
  map->set_epoch(1);
  map->set_num_virtual_shards(t.spec().num_virtual_shards());
  for (uint32_t s = 0; s < map->num_virtual_shards(); ++s) {
    v1::ShardAssignment* a = map->add_assignments();
    a->set_shard(s);
    a->set_primary("server-1");
  }
  v1::ServerEndpoint* e = map->add_servers();
  e->set_node_id("server-1");
  e->set_address("127.0.0.1:1");
  switch (fuzz.Pick(8)) {
    case 0: fuzz.Fill(t.mutable_spec()->mutable_model()); break;
    case 1: fuzz.Fill(t.mutable_spec()->mutable_dataset()); break;
    case 2: fuzz.Fill(t.mutable_spec()->mutable_optimizer()); break;
    case 3: fuzz.Fill(t.mutable_spec()->mutable_consistency()); break;
    case 4: fuzz.Fill(t.mutable_partition()); break;
    case 5: fuzz.Fill(t.mutable_shard_map()); break;
    case 6: {  // The top-level fields only.
      v1::AssignTaskRequest top;
      fuzz.Fill(&top);
      top.clear_spec();
      top.clear_partition();
      top.clear_shard_map();
      t.MergeFrom(top);
      break;
    }
    default: break;  // Valid as it is.
  }
  return t;
}

// Accepts whatever the worker tells it; counts the progress reports of the tasks it runs.
class AcceptingScheduler final : public v1::Scheduler::Service {
 public:
  grpc::Status RegisterNode(grpc::ServerContext*, const v1::RegisterNodeRequest*,
                            v1::RegisterNodeResponse* resp) override {
    resp->set_node_id("worker-1");
    resp->set_lease_ms(5000);
    resp->set_heartbeat_interval_ms(100);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse* resp) override {
    resp->set_lease_ms(5000);
    return grpc::Status::OK;
  }
  grpc::Status ReportProgress(grpc::ServerContext*, const v1::ReportProgressRequest*,
                              v1::ReportProgressResponse*) override {
    ++reports;
    return grpc::Status::OK;
  }
  std::atomic<int> reports{0};
};

TEST(WorkerFuzzTest, RandomControlCallsGetAStatusAndTheWorkerStaysUp) {
  AcceptingScheduler sched;
  auto sched_server = GrpcServer::Start({}, {&sched});
  ASSERT_TRUE(sched_server.ok());
  const std::string tmp = std::getenv("TEST_TMPDIR");
  testing::Daemon worker(testing::RunfilePath("worker/ps_worker"),
                         {"--listen=127.0.0.1:0", "--port_file=" + tmp + "/w.port",
                          "--scheduler=" + (*sched_server)->address(), "--device=cpu",
                          "--call_timeout_sec=2"},
                         tmp + "/w.log");
  auto address = worker.WaitForPortFile(tmp + "/w.port");
  ASSERT_TRUE(address.ok()) << address.status();
  auto channel = MakeChannel(*address);
  ASSERT_TRUE(channel.ok());
  auto stub = v1::WorkerControl::NewStub(*channel);

  testing::MessageFuzzer fuzz(17);
  fuzz.SetStrings({"", "x", "job-1", "mlp", "cnn", "sparse_linear", "fashion_mnist",
                   "spam_assassin", "adam", "sgd", "bsp", "cpu", "auto", "cuda",
                   "127.0.0.1:1", "server-1", tmp + "/m.safetensors", tmp + "/ckpt"});
  const testing::CallTally tally = testing::RunFuzzCalls(
      testing::FuzzIterations(1000), absl::Seconds(10),
      [&](int i, grpc::ClientContext* ctx, std::string* rpc) {
    grpc::Status st;
    switch (fuzz.Pick(5)) {
      case 0: {
        *rpc = "AssignTask";
        v1::AssignTaskRequest req;
        if (fuzz.Pick(2) == 0) {
          fuzz.Fill(&req);
        } else {
          req = MostlyValidTask(fuzz);
        }
        v1::AssignTaskResponse resp;
        st = stub->AssignTask(ctx, req, &resp);
        break;
      }
      case 1: {
        *rpc = "StopTask";
        v1::StopTaskRequest req;
        fuzz.Fill(&req);
        v1::StopTaskResponse resp;
        st = stub->StopTask(ctx, req, &resp);
        break;
      }
      case 2: {
        *rpc = "UpdateShardMap";
        v1::WorkerShardMapRequest req;
        fuzz.Fill(&req);
        v1::WorkerShardMapResponse resp;
        st = stub->UpdateShardMap(ctx, req, &resp);
        break;
      }
      case 3: {
        *rpc = "UpdatePartition";
        v1::UpdatePartitionRequest req;
        fuzz.Fill(&req);
        if (fuzz.Pick(2) == 0) {  // Aimed at the task the valid assignments start.
          req.set_job_id("job-1");
          req.set_rank(0);
          req.set_attempt(0);
        }
        v1::UpdatePartitionResponse resp;
        st = stub->UpdatePartition(ctx, req, &resp);
        break;
      }
      default: {
        *rpc = "Status";
        v1::WorkerStatusRequest req;
        fuzz.Fill(&req);
        v1::WorkerStatus resp;
        st = stub->Status(ctx, req, &resp);
        break;
      }
    }
    if (!worker.running()) {
      ADD_FAILURE() << *rpc << " took the worker down:\n" << worker.Log();
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker exited");
    }
    return st;
  });
  if (HasFatalFailure() || HasNonfatalFailure()) return;
  // The task's validation was reached, and tasks were started.
  EXPECT_GT(tally.Count("AssignTask", grpc::StatusCode::INVALID_ARGUMENT), 0);
  EXPECT_GT(tally.Count("AssignTask", grpc::StatusCode::OK), 0);

  v1::WorkerStatusRequest req;
  v1::WorkerStatus status;
  auto ctx = CallContext(absl::Seconds(5));
  EXPECT_TRUE(stub->Status(ctx.get(), req, &status).ok());
  EXPECT_EQ(worker.Signal(SIGTERM), 0) << worker.Log();
}

}  // namespace
}  // namespace pscluster
