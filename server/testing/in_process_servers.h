// Parameter servers in the test's own process, reached without sockets: each is a PsHandler
// behind the real gRPC service (PsService) on a gRPC server with no port (its in-process
// channel), and behind the real data-plane stream (DataStream) fed in memory. As a
// ServerConnector (PsClientOptions::connector) they let PsClient's routing, retries, map
// refreshes and exactly-once pushes be tested without the network, with faults injected per
// server: connections that cannot be opened, replies lost after the server applied a round,
// rounds that are never answered.
#ifndef PSCLUSTER_SERVER_TESTING_IN_PROCESS_SERVERS_H_
#define PSCLUSTER_SERVER_TESTING_IN_PROCESS_SERVERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/executor.h"
#include "grpcpp/server.h"
#include "proto/ps.pb.h"
#include "server/client/server_connector.h"
#include "server/ps_handler.h"
#include "server/ps_service.h"

namespace pscluster {
namespace testing {

class InProcessServers final : public ServerConnector {
 public:
  // `n` servers, node ids "ps-0".., addresses "in-process:0"..; `options` for each handler.
  explicit InProcessServers(int n, PsHandlerOptions options = {});
  ~InProcessServers() override;

  int size() const { return static_cast<int>(servers_.size()); }
  PsHandler* handler(int i) { return servers_[i]->handler.get(); }
  static std::string NodeId(int i);
  static std::string Address(int i);

  // A shard map of job `job` at `epoch`: `num_shards` virtual shards, shard s on
  // owners[s % owners.size()] (server indexes); every server of `owners` is listed.
  v1::ShardMap Map(const std::string& job, uint32_t num_shards, uint64_t epoch,
                   const std::vector<int>& owners) const;

  // ---- Faults, per server.

  // The next `n` data connections to server `i` fail to open with `why`.
  void FailOpens(int i, int n, absl::Status why);
  // The next `n` rounds sent to server `i` reach it and are applied, but their replies are
  // lost: the client's round fails with UNAVAILABLE.
  void LoseReplies(int i, int n);
  // While set, rounds sent to server `i` are neither delivered nor answered.
  void Stall(int i, bool stalled);
  // Data connections of server `i` are the gRPC PushPull stream on its in-process channel
  // (OpenData answers null) instead of an in-memory DataStream.
  void UseGrpcData(int i, bool grpc);
  // Data connections opened to server `i` so far (failed opens included; gRPC ones not).
  int opens(int i) const;
  // Rounds delivered to server `i` so far (lost replies included).
  int rounds(int i) const;

  // ---- ServerConnector.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> Channel(const std::string& address) override;
  absl::StatusOr<std::shared_ptr<DataConn>> OpenData(const std::string& address) override;

  // The faults of one server, shared with its connections.
  struct Faults {
    mutable absl::Mutex mu;
    int fail_opens ABSL_GUARDED_BY(mu) = 0;
    absl::Status open_error ABSL_GUARDED_BY(mu);
    int lose_replies ABSL_GUARDED_BY(mu) = 0;
    bool stalled ABSL_GUARDED_BY(mu) = false;
    bool grpc ABSL_GUARDED_BY(mu) = false;
    int opens ABSL_GUARDED_BY(mu) = 0;
    int rounds ABSL_GUARDED_BY(mu) = 0;
  };

 private:
  struct Server {
    std::unique_ptr<PsHandler> handler;
    std::unique_ptr<PsService> service;
    std::unique_ptr<grpc::Server> grpc;
    std::shared_ptr<Faults> faults = std::make_shared<Faults>();
  };
  absl::StatusOr<int> IndexOf(const std::string& address) const;

  RealClock clock_;
  Executor data_{2, "inproc-data"};
  Executor control_{1, "inproc-ctl"};
  std::vector<std::unique_ptr<Server>> servers_;
};

}  // namespace testing
}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_TESTING_IN_PROCESS_SERVERS_H_
