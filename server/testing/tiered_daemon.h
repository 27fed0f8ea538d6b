// The real ps_server binary with a memory cap and a disk tier (--memory_bytes, --spill_dir), for
// tests that checkpoint, kill and restore it: start one, reach its job through the data plane,
// read its table's status, restore a checkpoint file over gRPC.
#ifndef PSCLUSTER_SERVER_TESTING_TIERED_DAEMON_H_
#define PSCLUSTER_SERVER_TESTING_TIERED_DAEMON_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "proto/ps.grpc.pb.h"
#include "server/client/ps_client.h"
#include "server/testing/daemon.h"
#include "server/testing/test_tables.h"

namespace pscluster::testing {

struct TieredServer {
  std::unique_ptr<Daemon> daemon;
  std::string address;  // Empty when it did not start (the test has failed).
};

// Starts ps_server with `memory_bytes` and `spill_dir` (logs and port file named after `tag`).
inline TieredServer StartTieredServer(const std::string& tag, uint64_t memory_bytes,
                                      const std::string& spill_dir) {
  TieredServer s;
  const std::string port_file = TempDir(tag + ".port");
  s.daemon = std::make_unique<Daemon>(
      RunfilePath("server/ps_server"),
      std::vector<std::string>{"--listen=127.0.0.1:0", "--port_file=" + port_file,
                               absl::StrCat("--memory_bytes=", memory_bytes),
                               "--spill_dir=" + spill_dir, "--log_level=info"},
      TempDir(tag + ".log"));
  auto address = s.daemon->WaitForPortFile(port_file);
  EXPECT_TRUE(address.ok()) << address.status();
  if (address.ok()) s.address = *address;
  return s;
}

// A client of job "job" (4 virtual shards, all on `s`, one ASP worker) with `table` created.
// Null when that failed (the test has failed). A call to a server that is gone fails after
// `call_timeout`.
inline std::unique_ptr<PsClient> JobClient(const TieredServer& s, const v1::TableSpec& table,
                                           absl::Duration call_timeout = absl::Seconds(20)) {
  PsClientOptions o;
  o.job_id = "job";
  o.call_timeout = call_timeout;
  auto client = PsClient::Create(o, RoundRobinMap("job", 4, {s.address}), {table});
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  EXPECT_TRUE((*client)->InstallShardMap().ok());
  v1::ConsistencySpec asp;
  asp.set_mode(v1::ConsistencySpec::ASP);
  absl::Status created = (*client)->CreateTables(asp, 1);
  EXPECT_TRUE(created.ok()) << created;
  return std::move(*client);
}

// The status of the job's first table on the client's (only) server.
inline v1::TableStatus FirstTableOf(PsClient& client) {
  auto st = client.ServerStatuses();
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok() || st->empty() || (*st)[0].jobs_size() == 0) return {};
  return (*st)[0].jobs(0).tables(0);
}

// Restores checkpoint `path` into job "job" on `s`; the step it restored.
inline int64_t RestoreOn(const TieredServer& s, const std::string& path) {
  auto stub = v1::ParameterServer::NewStub(*MakeChannel(s.address));
  v1::RestoreRequest req;
  req.set_job_id("job");
  req.set_path(path);
  v1::RestoreResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = stub->Restore(&ctx, req, &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return st.ok() ? resp.step() : -1;
}

}  // namespace pscluster::testing

#endif  // PSCLUSTER_SERVER_TESTING_TIERED_DAEMON_H_
