// The real ps_server binary with a memory cap and a disk tier (--memory_bytes, --spill_dir), for
// tests that checkpoint, kill and restore it: start one, reach its job through the data plane,
// read its table's status, restore a checkpoint file over gRPC.
#ifndef PSCLUSTER_SERVER_TESTING_TIERED_DAEMON_H_
#define PSCLUSTER_SERVER_TESTING_TIERED_DAEMON_H_

#include <gtest/gtest.h>

#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
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

// The table of the tests that move a table thirty times their servers' memory cap (checkpoint
// and restore, a live copy and its takeover): 10^6 rows of width 16 with Adagrad.
namespace big_table {
inline constexpr uint32_t kWidth = 16;
inline constexpr uint64_t kKeys = 1000000;
inline constexpr uint64_t kRowBytes = kWidth * 2 * sizeof(float);  // Weights and accumulator.
inline constexpr uint64_t kTableBytes = kKeys * kRowBytes;         // 122 MiB of rows.
inline constexpr uint64_t kCap = 4 << 20;                          // 4 MiB: 3% of the table.
inline constexpr uint64_t kPerPush = 8192;
inline constexpr uint64_t kMiB = 1 << 20;
inline const v1::TableSpec& Emb() {
  static const v1::TableSpec* spec = new v1::TableSpec(
      SparseSpec("emb", kWidth, kKeys, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.05f)));
  return *spec;
}
}  // namespace big_table

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

// The status of the job's first table on the client's (only) server.
inline v1::TableStatus FirstTableOf(PsClient& client) {
  auto st = client.ServerStatuses();
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok() || st->empty() || (*st)[0].jobs_size() == 0) return {};
  return (*st)[0].jobs(0).tables(0);
}

// A field of /proc/<pid>/status (VmHWM: the peak resident memory, VmRSS), in bytes.
inline uint64_t ProcStatusBytes(pid_t pid, const std::string& field) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  ADD_FAILURE() << "no " << field << " for process " << pid;
  return 0;
}

// A client of job "job" on the servers of `map` (to whom it installs the map), the tables
// created on every one of them (one ASP worker). Null when that failed (the test has failed).
inline std::unique_ptr<PsClient> ClientOnMap(const v1::ShardMap& map, const v1::TableSpec& table,
                                             absl::Duration call_timeout) {
  PsClientOptions o;
  o.job_id = "job";
  o.call_timeout = call_timeout;
  auto client = PsClient::Create(o, map, {table});
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  EXPECT_TRUE((*client)->InstallShardMap().ok());
  v1::ConsistencySpec asp;
  asp.set_mode(v1::ConsistencySpec::ASP);
  absl::Status created = (*client)->CreateTables(asp, 1);
  EXPECT_TRUE(created.ok()) << created;
  return std::move(*client);
}

// A client of job "job" (16 virtual shards, all on `s`, one ASP worker) with `table` created.
// Null when that failed (the test has failed). A call to a server that is gone fails after
// `call_timeout`.
inline std::unique_ptr<PsClient> JobClient(const TieredServer& s, const v1::TableSpec& table,
                                           absl::Duration call_timeout = absl::Seconds(20)) {
  return ClientOnMap(RoundRobinMap("job", 4, {s.address}), table, call_timeout);
}

// Pushes every key of [0, keys) of sparse table `table` (rows of `width`) once, `per_push` keys
// a step from step 0, gradient element i of the push starting at key f being
// 0.001 * ((f + i) % modulus) - 0.0005 * modulus. Returns the number of steps pushed.
inline int64_t PushEveryKey(PsClient& client, const std::string& table, uint64_t keys,
                            uint32_t width, uint64_t per_push, uint64_t modulus = 29) {
  int64_t step = 0;
  std::vector<uint64_t> k(per_push);
  std::vector<float> g(per_push * width);
  for (uint64_t first = 0; first < keys; first += per_push, ++step) {
    k.resize(std::min(per_push, keys - first));
    for (size_t i = 0; i < k.size(); ++i) k[i] = first + i;
    for (size_t i = 0; i < k.size() * width; ++i) {
      g[i] = 0.001f * static_cast<float>((first + i) % modulus) - 0.0005f * modulus;
    }
    absl::Status s = client.Push(step, {{}, {{table, k, g.data()}}});
    EXPECT_TRUE(s.ok()) << "push of keys from " << first << ": " << s;
    if (!s.ok()) break;
  }
  return step;
}

// The rows of every `stride`th key of [0, keys) of sparse table `table`, read at `clock`.
inline std::vector<float> PullEvery(PsClient& client, const std::string& table, uint64_t keys,
                                    uint64_t stride, uint32_t width, int64_t clock) {
  std::vector<uint64_t> k;
  for (uint64_t key = 0; key < keys; key += stride) k.push_back(key);
  std::vector<float> rows(k.size() * width);
  absl::Status s = client.Pull(clock, {{}, {{table, k, rows.data()}}});
  EXPECT_TRUE(s.ok()) << s;
  return rows;
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
