// The fixture of the TCP data-plane tests (tcp_data_plane_test.cc, local_data_plane_test.cc):
// clients of in-process servers over a chosen transport, and a short training run whose values
// each transport must reproduce bit for bit.
#ifndef PSCLUSTER_TESTS_INTEGRATION_DATA_PLANE_FIXTURE_H_
#define PSCLUSTER_TESTS_INTEGRATION_DATA_PLANE_FIXTURE_H_

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/status_convert.h"
#include "server/client/tcp_conn.h"
#include "server/shm_ring.h"
#include "server/tcp_frame.h"
#include "server/testing/cluster.h"
#include "server/wire.h"
#include "tests/integration/raw_frames.h"

namespace pscluster::testing {

inline const v1::OptimizerSpec kAdam = Optimizer(v1::OptimizerSpec::ADAM, 0.01f);

inline v1::ServerStatus StatusOf(const std::string& address, const ChannelOptions& ch = {}) {
  auto channel = MakeChannel(address, ch);
  EXPECT_TRUE(channel.ok()) << channel.status();
  auto stub = v1::ParameterServer::NewStub(*channel);
  v1::ServerStatus resp;
  auto ctx = CallContext(absl::Seconds(5));
  v1::ServerStatusRequest req;
  EXPECT_TRUE(stub->Status(ctx.get(), req, &resp).ok());
  return resp;
}

class TcpDataPlaneTest : public ::testing::Test {
 public:  // The helpers are used by free functions below too.
  // A client of job "job" over `transport`, with `tables` created under `mode` for `workers`
  // workers (nullptr after a test failure).
  static std::unique_ptr<PsClient> ClientWith(InProcessCluster& cluster,
                                              const std::vector<v1::TableSpec>& tables,
                                              DataTransport transport,
                                              v1::ConsistencySpec::Mode mode, uint32_t workers,
                                              absl::Duration timeout = absl::Seconds(20),
                                              size_t shm_ring_bytes = 16 << 20) {
    PsClientOptions o;
    o.data_transport = transport;
    o.call_timeout = timeout;
    o.shm_ring_bytes = shm_ring_bytes;
    auto client = cluster.Client("job", tables, 0, o);
    if (!client.ok()) {
      ADD_FAILURE() << client.status();
      return nullptr;
    }
    v1::ConsistencySpec c;
    c.set_mode(mode);
    absl::Status st = (*client)->CreateTables(c, workers);
    if (!st.ok()) {
      ADD_FAILURE() << st;
      return nullptr;
    }
    return std::move(*client);
  }

  // The same over the TCP data port with one table.
  static std::unique_ptr<PsClient> TcpClient(InProcessCluster& cluster,
                                             const v1::TableSpec& table,
                                             v1::ConsistencySpec::Mode mode, uint32_t workers,
                                             absl::Duration timeout = absl::Seconds(20)) {
    return ClientWith(cluster, {table}, DataTransport::kTcp, mode, workers, timeout);
  }

  // A client of job "job" with the default transport (auto) creates `table` (ASP, 1 worker) and
  // pulls it.
  static void AutoClientPulls(InProcessCluster& cluster, const v1::TableSpec& table) {
    v1::ConsistencySpec asp;
    asp.set_mode(v1::ConsistencySpec::ASP);
    auto client = cluster.Client("job", {table});
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->CreateTables(asp, 1).ok());
    std::vector<float> v(table.shape().dims(0));
    EXPECT_TRUE((*client)->Pull(0, {{{table.name(), v.data()}}, {}}).ok());
  }

  // The client whose table hostile connections must leave alone: job "job", table "w" (1000
  // floats, ASP, over TCP), pulled into `before` (nullptr after a test failure).
  static std::unique_ptr<PsClient> VictimClient(InProcessCluster& cluster,
                                                std::vector<float>* before) {
    auto client =
        TcpClient(cluster, DenseSpec("w", {1000}, kAdam, 256), v1::ConsistencySpec::ASP, 1);
    if (client == nullptr) return nullptr;
    before->assign(1000, 0.f);
    absl::Status st = client->Pull(0, {{{"w", before->data()}}, {}});
    if (!st.ok()) {
      ADD_FAILURE() << st;
      return nullptr;
    }
    return client;
  }

  // A client that requires `transport` fails its pull with a message containing `why`.
  static void RequiredTransportFails(InProcessCluster& cluster, const v1::TableSpec& table,
                                     DataTransport transport, const std::string& why) {
    PsClientOptions o;
    o.data_transport = transport;
    o.call_timeout = absl::Seconds(1);
    auto strict = cluster.Client("job", {table}, 0, o);
    ASSERT_TRUE(strict.ok());
    std::vector<float> v(table.shape().dims(0));
    absl::Status st = (*strict)->Pull(0, {{{table.name(), v.data()}}, {}});
    EXPECT_FALSE(st.ok());
    EXPECT_TRUE(absl::StrContains(st.message(), why)) << st;
  }

  // What the server of a Train() run passed through shared memory.
  struct ShmUse {
    int connections = 0;
    uint64_t received = 0;  // Payload bytes.
    uint64_t sent = 0;
  };

  // Runs the same 5 steps of push-pull against `servers` fresh servers with `transport`;
  // returns the final dense (`dense` values in blocks of `block`) and sparse values.
  static std::vector<float> Train(DataTransport transport, bool* used_ok, int servers = 1,
                                  uint64_t dense = 3000, uint64_t block = 512,
                                  PsClient::Stats* stats = nullptr,
                                  size_t shm_ring_bytes = 16 << 20, ShmUse* shm = nullptr) {
    InProcessCluster cluster(servers);
    EXPECT_TRUE(cluster.status().ok()) << cluster.status();
    auto w = DenseSpec("w", {dense}, kAdam, block);
    auto e = SparseSpec("e", 8, 1000, kAdam);
    auto client = ClientWith(cluster, {w, e}, transport, v1::ConsistencySpec::BSP, 1,
                             absl::Seconds(20), shm_ring_bytes);
    *used_ok = client != nullptr;
    if (client == nullptr) return {};
    std::vector<float> wv(dense), g(dense);
    std::vector<uint64_t> keys = {1, 7, 7, 999};
    std::vector<float> rows(keys.size() * 8), rg(keys.size() * 8);
    for (int step = 0; step < 5; ++step) {
      for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.01f * i + step);
      for (size_t i = 0; i < rg.size(); ++i) rg[i] = std::cos(0.1f * i - step);
      absl::Status st = client->PushPull(step, {{{"w", g.data()}}, {{"e", keys, rg.data()}}},
                                            {{{"w", wv.data()}}, {{"e", keys, rows.data()}}});
      if (!st.ok()) {
        ADD_FAILURE() << st;
        *used_ok = false;
      }
    }
    wv.insert(wv.end(), rows.begin(), rows.end());
    if (stats != nullptr) *stats = client->stats();
    if (shm != nullptr) {
      shm->connections = cluster.server(0)->data_shm_connections();
      shm->received = cluster.server(0)->data_shm_bytes_received();
      shm->sent = cluster.server(0)->data_shm_bytes_sent();
    }
    return wv;
  }
};

}  // namespace pscluster::testing

#endif  // PSCLUSTER_TESTS_INTEGRATION_DATA_PLANE_FIXTURE_H_
