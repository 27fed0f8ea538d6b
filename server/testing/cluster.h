// In-process tier helpers: parameter servers on loopback port 0 and clients routed to them.
#ifndef PSCLUSTER_SERVER_TESTING_CLUSTER_H_
#define PSCLUSTER_SERVER_TESTING_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "server/client/ps_client.h"
#include "server/ps_server.h"
#include "server/testing/test_tables.h"

namespace pscluster {
namespace testing {

class InProcessCluster {
 public:
  explicit InProcessCluster(int servers, PsServerOptions options = {}) {
    for (int i = 0; i < servers; ++i) {
      auto s = PsServer::Start(options, &clock_);
      if (!s.ok()) {
        status_ = s.status();
        return;
      }
      addresses_.push_back((*s)->address());
      servers_.push_back(std::move(*s));
    }
  }
  const absl::Status& status() const { return status_; }
  const std::vector<std::string>& addresses() const { return addresses_; }
  PsServer* server(int i) { return servers_[i].get(); }

  v1::ShardMap Map(const std::string& job, uint64_t epoch = 1) const {
    return RoundRobinMap(job, epoch, addresses_);
  }

  // A client for `job` as worker `rank`, with the map installed on the servers.
  absl::StatusOr<std::unique_ptr<PsClient>> Client(const std::string& job,
                                                   const std::vector<v1::TableSpec>& tables,
                                                   uint32_t rank = 0,
                                                   PsClientOptions options = {}) {
    options.job_id = job;
    options.worker = rank;
    if (options.call_timeout == absl::Seconds(60)) options.call_timeout = absl::Seconds(20);
    auto c = PsClient::Create(options, Map(job), tables);
    if (!c.ok()) return c.status();
    absl::Status st = (*c)->InstallShardMap();
    if (!st.ok()) return st;
    return c;
  }

 private:
  RealClock clock_;
  absl::Status status_;
  std::vector<std::unique_ptr<PsServer>> servers_;
  std::vector<std::string> addresses_;
};

}  // namespace testing
}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_TESTING_CLUSTER_H_
