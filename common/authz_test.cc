// The authorization table against the services as the .proto files declare them: every method
// of every pscluster service has an entry, and each role gets the answer spelled out here.
#include "common/authz.h"

#include <map>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "proto/scheduler.pb.h"
#include "proto/worker.pb.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

// Every method of every service in the pscluster .proto files that declare services.
std::vector<const google::protobuf::MethodDescriptor*> AllMethods() {
  const google::protobuf::FileDescriptor* files[] = {
      v1::RegisterNodeRequest::descriptor()->file(),  // scheduler.proto
      v1::PullRequest::descriptor()->file(),          // ps.proto
      v1::AssignTaskRequest::descriptor()->file(),    // worker.proto
  };
  std::vector<const google::protobuf::MethodDescriptor*> out;
  for (const auto* f : files) {
    for (int s = 0; s < f->service_count(); ++s) {
      for (int m = 0; m < f->service(s)->method_count(); ++m)
        out.push_back(f->service(s)->method(m));
    }
  }
  return out;
}

// Who may call what, written out a second time by hand: a change to the table must change this.
const std::map<std::string, std::string>& Expected() {
  static const auto* e = new std::map<std::string, std::string>{
      {"pscluster.v1.Scheduler.RegisterNode", "node"},
      {"pscluster.v1.Scheduler.Heartbeat", "node"},
      {"pscluster.v1.Scheduler.Deregister", "node"},
      {"pscluster.v1.Scheduler.SubmitJob", "admin"},
      {"pscluster.v1.Scheduler.GetJob", "admin viewer"},
      {"pscluster.v1.Scheduler.ListJobs", "admin viewer"},
      {"pscluster.v1.Scheduler.CancelJob", "admin"},
      {"pscluster.v1.Scheduler.GetShardMap", "admin viewer node"},
      {"pscluster.v1.Scheduler.ReportProgress", "node"},
      {"pscluster.v1.Scheduler.ClusterStatus", "admin viewer"},
      {"pscluster.v1.Scheduler.MoveShard", "admin"},
      {"pscluster.v1.Scheduler.CheckpointJob", "admin"},
      {"pscluster.v1.Scheduler.ExportJob", "admin"},
      {"pscluster.v1.Scheduler.GetTaskLogs", "admin viewer"},
      {"pscluster.v1.Scheduler.ScaleJob", "admin"},
      {"pscluster.v1.Scheduler.DrainServer", "admin"},
      {"pscluster.v1.Scheduler.UndrainServer", "admin"},
      {"pscluster.v1.ParameterServer.CreateTables", "scheduler worker"},
      {"pscluster.v1.ParameterServer.UpdateShardMap", "scheduler worker"},
      {"pscluster.v1.ParameterServer.Pull", "worker"},
      {"pscluster.v1.ParameterServer.Push", "worker"},
      {"pscluster.v1.ParameterServer.PushPull", "worker"},
      {"pscluster.v1.ParameterServer.Checkpoint", "scheduler"},
      {"pscluster.v1.ParameterServer.Restore", "scheduler"},
      {"pscluster.v1.ParameterServer.Export", "scheduler"},
      {"pscluster.v1.ParameterServer.DropJob", "scheduler"},
      {"pscluster.v1.ParameterServer.Status", "admin viewer scheduler worker server"},
      {"pscluster.v1.ParameterServer.FenceWorker", "scheduler"},
      {"pscluster.v1.ParameterServer.Replicate", "server"},
      {"pscluster.v1.ParameterServer.ListKeys", "worker"},
      {"pscluster.v1.WorkerControl.AssignTask", "scheduler"},
      {"pscluster.v1.WorkerControl.StopTask", "scheduler"},
      {"pscluster.v1.WorkerControl.UpdateShardMap", "scheduler"},
      {"pscluster.v1.WorkerControl.UpdatePartition", "scheduler"},
      {"pscluster.v1.WorkerControl.Status", "admin viewer scheduler"},
      {"pscluster.v1.WorkerControl.ExportModel", "scheduler"},
      {"pscluster.v1.WorkerControl.GetTaskLogs", "admin viewer scheduler"},
  };
  return *e;
}

TEST(AuthzTableTest, EveryMethodOfEveryServiceHasAnEntry) {
  auto methods = AllMethods();
  ASSERT_GE(methods.size(), 28u);
  std::set<std::string> names;
  for (const auto* m : methods) {
    names.insert(m->full_name());
    EXPECT_NE(AllowedRoles(m->full_name()), nullptr)
        << m->full_name() << " has no entry in the authorization table (common/authz.cc)";
    EXPECT_EQ(Expected().count(m->full_name()), 1u)
        << m->full_name() << " has no expected answer in this test";
  }
  // No stale entries: each entry names a method that exists, once.
  std::set<std::string> seen;
  for (const auto& [method, roles] : AuthorizationTable()) {
    EXPECT_EQ(names.count(method), 1u) << method << " is in the table but not in any service";
    EXPECT_TRUE(seen.insert(method).second) << method << " has two entries";
    EXPECT_NE(roles, 0u) << method << " allows nobody";
  }
}

TEST(AuthzTableTest, EachRoleGetsTheAnswerOfTheTable) {
  for (const auto* m : AllMethods()) {
    const std::string want = " " + Expected().at(m->full_name()) + " ";
    for (Role r : AllRoles()) {
      Identity id{"caller", Roles(r)};
      absl::Status s = Authorizer::Decide(m->full_name(), &id);
      const bool allowed = want.find(" " + std::string(RoleName(r)) + " ") != std::string::npos;
      if (allowed) {
        EXPECT_TRUE(s.ok()) << m->full_name() << " as " << RoleName(r) << ": " << s;
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied)
            << m->full_name() << " as " << RoleName(r);
        EXPECT_THAT(std::string(s.message()), HasSubstr(" needs role "));
      }
    }
    // No role at all, and no identity at all.
    Identity none{"nobody", 0};
    EXPECT_EQ(Authorizer::Decide(m->full_name(), &none).code(),
              absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(Authorizer::Decide(m->full_name(), nullptr).code(),
              absl::StatusCode::kUnauthenticated);
  }
}

TEST(AuthzTableTest, RefusalsNameTheRoleNeeded) {
  Identity viewer{"vera", Roles(Role::kViewer)};
  absl::Status s = Authorizer::Decide("pscluster.v1.Scheduler.CancelJob", &viewer);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("pscluster.v1.Scheduler.CancelJob needs role admin; 'vera' has viewer"));
  Identity worker{"w1", Role::kWorker | Role::kNode};
  s = Authorizer::Decide("pscluster.v1.ParameterServer.DropJob", &worker);
  EXPECT_THAT(std::string(s.message()), HasSubstr("needs role scheduler; 'w1' has node,worker"));
}

TEST(AuthzTableTest, AMethodWithoutAnEntryIsRefused) {
  Identity admin{"root", ~0u};
  EXPECT_EQ(Authorizer::Decide("pscluster.v1.Scheduler.NoSuchMethod", &admin).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(AuthorizerTest, WithoutATokenFileEverythingIsOpen) {
  auto a = Authorizer::Create("");
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE((*a)->enabled());
  EXPECT_TRUE((*a)->Reload().ok());
}

TEST(AuthorizerTest, ABadTokenFileIsRefusedAtStartAndKeptOutOnReload) {
  std::string path = ::testing::TempDir() + "/authz_tokens";
  FILE* f = fopen(path.c_str(), "w");
  fputs("bad line\n", f);
  fclose(f);
  auto a = Authorizer::Create(path);
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(std::string(a.status().message()), HasSubstr(path + ":1:"));
  f = fopen(path.c_str(), "w");
  fprintf(f, "%s alice admin\n", Sha256Hex("t").c_str());
  fclose(f);
  a = Authorizer::Create(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->enabled());
  f = fopen(path.c_str(), "w");
  fputs("still bad\n", f);
  fclose(f);
  EXPECT_EQ((*a)->Reload().code(), absl::StatusCode::kInvalidArgument);
}

// The web status page's check: a bearer token in the Authorization header, as for gRPC.
TEST(AuthorizerTest, CheckBearerForCallsOutsideGrpc) {
  std::string path = ::testing::TempDir() + "/authz_bearer_tokens";
  FILE* f = fopen(path.c_str(), "w");
  fprintf(f, "%s viewer1 viewer\n%s node1 node\n", Sha256Hex("vt").c_str(),
          Sha256Hex("nt").c_str());
  fclose(f);
  auto a = Authorizer::Create(path);
  ASSERT_TRUE(a.ok()) << a.status();
  const char* kMethod = "pscluster.v1.Scheduler.ClusterStatus";
  EXPECT_TRUE((*a)->CheckBearer("Bearer vt", kMethod).ok());
  EXPECT_TRUE((*a)->CheckBearer("bearer vt", kMethod).ok());
  EXPECT_EQ((*a)->CheckBearer("", kMethod).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*a)->CheckBearer("Basic dnQ=", kMethod).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*a)->CheckBearer("Bearer nope", kMethod).code(), absl::StatusCode::kUnauthenticated);
  absl::Status s = (*a)->CheckBearer("Bearer nt", kMethod);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("needs role admin or viewer"));
  auto open = Authorizer::Create("");
  EXPECT_TRUE((*open)->CheckBearer("", kMethod).ok());
}

}  // namespace
}  // namespace pscluster
