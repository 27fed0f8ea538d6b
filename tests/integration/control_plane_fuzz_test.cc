// Hostile control calls to a parameter server: CreateTables, UpdateShardMap, Checkpoint,
// Restore, Export, DropJob, FenceWorker, Replicate and Status with every field filled at random
// (edge integers, NaN,
// unknown enum values, odd and oversized strings, deep nesting; paths only inside the test's
// directory). Each call must end with a status within its deadline; a job the calls never name
// keeps its values; the server serves and trains it afterwards.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/testing/message_fuzzer.h"
#include "proto/ps.grpc.pb.h"
#include "server/testing/cluster.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

TEST(ControlPlaneFuzzTest, RandomControlCallsGetAStatusAndLeaveOtherJobsAlone) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  PsClientOptions o;
  o.data_transport = DataTransport::kTcp;
  const auto adam = Optimizer(v1::OptimizerSpec::ADAM, 0.01f);
  auto victim = cluster.Client("victim", {DenseSpec("w", {1000}, adam, 256)}, 0, o);
  ASSERT_TRUE(victim.ok()) << victim.status();
  v1::ConsistencySpec asp;
  asp.set_mode(v1::ConsistencySpec::ASP);
  ASSERT_TRUE((*victim)->CreateTables(asp, 1).ok());
  std::vector<float> before(1000);
  ASSERT_TRUE((*victim)->Pull(0, {{{"w", before.data()}}, {}}).ok());
  // A job for the calls to aim at, with some state.
  auto fz = cluster.Client("fz", {DenseSpec("w", {1000}, adam, 256),
                                  SparseSpec("e", 8, 1000, adam)}, 0, o);
  ASSERT_TRUE(fz.ok()) << fz.status();
  ASSERT_TRUE((*fz)->CreateTables(asp, 2).ok());

  const std::string tmp = std::getenv("TEST_TMPDIR");
  MessageFuzzer fuzz(5);
  fuzz.SetStrings({"", "fz", "fz2", "w", "e", "x", "job-\xff\xfe", cluster.addresses()[0],
                   "127.0.0.1:1", tmp + "/ckpt", tmp + "/ckpt/fz.ckpt", tmp + "/m.safetensors",
                   tmp + "/missing/dir/m.safetensors", tmp + "/not-a-checkpoint", tmp});
  auto channel = MakeChannel(cluster.addresses()[0]);
  ASSERT_TRUE(channel.ok());
  auto stub = v1::ParameterServer::NewStub(*channel);
  const CallTally tally = RunFuzzCalls(
      FuzzIterations(3000), absl::Seconds(10),
      [&](int i, grpc::ClientContext* ctx, std::string* rpc) {
    grpc::Status st;
    if (i % 20 == 0) (void)(*fz)->CreateTables(asp, 2);  // Back after a DropJob, with state.
    switch (fuzz.Pick(10)) {
      case 0: {
        *rpc = "CreateTables";
        v1::CreateTablesRequest req;
        fuzz.Fill(&req);
        v1::CreateTablesResponse resp;
        st = stub->CreateTables(ctx, req, &resp);
        break;
      }
      case 1: {
        *rpc = "UpdateShardMap";
        v1::UpdateShardMapRequest req;
        fuzz.Fill(&req);
        v1::UpdateShardMapResponse resp;
        st = stub->UpdateShardMap(ctx, req, &resp);
        break;
      }
      case 2: {
        *rpc = "Checkpoint";
        v1::CheckpointRequest req;
        fuzz.Fill(&req);
        v1::CheckpointResponse resp;
        st = stub->Checkpoint(ctx, req, &resp);
        if (st.ok()) fuzz.AddKnown(resp.path());
        break;
      }
      case 3: {
        *rpc = "Restore";
        v1::RestoreRequest req;
        fuzz.Fill(&req);
        v1::RestoreResponse resp;
        st = stub->Restore(ctx, req, &resp);
        break;
      }
      case 4: {
        *rpc = "Export";
        v1::ExportRequest req;
        fuzz.Fill(&req);
        v1::ExportResponse resp;
        st = stub->Export(ctx, req, &resp);
        break;
      }
      case 5: {
        *rpc = "DropJob";
        v1::DropJobRequest req;
        fuzz.Fill(&req);
        v1::DropJobResponse resp;
        st = stub->DropJob(ctx, req, &resp);
        break;
      }
      case 6: {
        *rpc = "FenceWorker";
        v1::FenceWorkerRequest req;
        fuzz.Fill(&req);
        v1::FenceWorkerResponse resp;
        st = stub->FenceWorker(ctx, req, &resp);
        break;
      }
      case 7: {
        // Replication, live copies' snapshots included (random parts, offsets and sizes).
        *rpc = "Replicate";
        v1::ReplicateRequest req;
        fuzz.Fill(&req);
        v1::ReplicateResponse resp;
        st = stub->Replicate(ctx, req, &resp);
        break;
      }
      case 8: {
        *rpc = "ListKeys";
        v1::ListKeysRequest req;
        fuzz.Fill(&req);
        v1::ListKeysResponse resp;
        st = stub->ListKeys(ctx, req, &resp);
        break;
      }
      default: {
        *rpc = "Status";
        v1::ServerStatusRequest req;
        fuzz.Fill(&req);
        v1::ServerStatus resp;
        st = stub->Status(ctx, req, &resp);
        break;
      }
    }
    return st;
  });
  if (HasFatalFailure() || HasNonfatalFailure()) return;
  EXPECT_GT(tally.Count("CreateTables", grpc::StatusCode::INVALID_ARGUMENT), 0);  // Validation reached.

  std::vector<float> after(1000);
  ASSERT_TRUE((*victim)->Pull(0, {{{"w", after.data()}}, {}}).ok());
  EXPECT_EQ(before, after);
  std::vector<float> g(1000, 1.f);
  ASSERT_TRUE((*victim)->PushPull(0, {{{"w", g.data()}}, {}}, {{{"w", after.data()}}, {}}).ok());
  EXPECT_NE(before, after);
}

}  // namespace
}  // namespace pscluster
