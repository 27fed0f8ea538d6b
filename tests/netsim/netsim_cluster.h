// A real pscluster spread over the hosts of a netsim network: the ps_scheduler, each ps_server
// and each ps_worker on a host of its own (its own namespace, address and shaped link), so every
// call between two daemons crosses two links and the bridge — no loopback, no Unix socket, no
// shared memory. The test process itself moves into a host of its own ("ctl", unshaped), from
// where it calls the scheduler and runs psctl.
//
// A test that uses it lists these data deps: //scheduler:ps_scheduler, //scheduler:psctl,
// //server:ps_server, //worker:ps_worker; it is tagged "exclusive" and "netsim".
//
//   auto c = NetsimCluster::Start("my_test", {.servers = 2, .workers = 3, .rate = "1gbit"});
//   if (IsUnsupported(c.status())) GTEST_SKIP() << c.status();
//
// REQUIRES: Start is called before the test process starts any thread (see Network::Enter);
// one cluster per test process. Not thread-safe.
#ifndef PSCLUSTER_TESTS_NETSIM_NETSIM_CLUSTER_H_
#define PSCLUSTER_TESTS_NETSIM_NETSIM_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/scheduler.pb.h"
#include "scheduler/psctl/client.h"
#include "scheduler/psctl/subprocess.h"
#include "tests/cluster/scheduler_cluster_fixture.h"
#include "tests/netsim/netsim.h"

namespace pscluster::testing {

struct NetsimClusterOptions {
  int servers = 2;
  int workers = 2;
  std::string rate = "1gbit";  // Every daemon's link.
  std::vector<std::string> scheduler_args;
  std::vector<std::string> server_args;
  std::vector<std::string> worker_args;
  absl::Duration startup_timeout = absl::Seconds(60);
};

// Whether a Start error means "no namespaces here" (skip) rather than a failure.
bool IsUnsupported(const absl::Status& status);

class NetsimCluster {
 public:
  // Makes the network (hosts "scheduler", "server-1".., "worker-1".., "ctl"), moves this process
  // into "ctl", starts the daemons and waits until the scheduler lists every server and worker
  // as alive. FAILED_PRECONDITION where namespaces cannot be made (IsUnsupported).
  static absl::StatusOr<std::unique_ptr<NetsimCluster>> Start(const std::string& name,
                                                              NetsimClusterOptions options);
  // Stops the daemons (SIGTERM, then SIGKILL), then removes the network.
  ~NetsimCluster();

  const std::string& dir() const { return dir_; }
  netsim::Network& network() { return *net_; }
  const std::string& scheduler_address() const { return scheduler_address_; }
  // The daemon on a host ("server-1", "worker-2"): its address and log file ("" if unknown).
  std::string Address(const std::string& host) const;
  std::string LogFile(const std::string& host) const;

  // psctl with --scheduler=<this cluster>, run from the ctl host.
  CommandResult Psctl(std::vector<std::string> args,
                      absl::Duration timeout = absl::Seconds(60)) const;
  std::string WriteFile(const std::string& name, const std::string& text) const;
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) const;
  absl::StatusOr<v1::ClusterStatusResponse> ClusterStatus() const;
  // The scheduler's state of a node, if it lists it.
  std::optional<v1::NodeState> NodeState(const std::string& node_id) const;
  // The host whose daemon registered as `node_id` ("" if none).
  std::string HostOfNode(const std::string& node_id) const;
  absl::StatusOr<v1::Job> WaitForEnd(const std::string& job_id, absl::Duration timeout) const;
  // The last lines of every daemon's log, for failure messages.
  std::string LogTails(int lines = 25) const;

 private:
  struct Daemon {
    std::string host;
    std::string log;
    std::string address;
    std::string node_id;
    std::unique_ptr<psctl::Subprocess> proc;
  };
  NetsimCluster() = default;
  absl::Status Launch(const std::string& host, const std::string& binary,
                      std::vector<std::string> args);
  const Daemon* Find(const std::string& host) const;

  std::string dir_;
  std::unique_ptr<netsim::Network> net_;  // Destroyed after the daemons.
  std::vector<Daemon> daemons_;
  std::string scheduler_address_;
  std::unique_ptr<psctl::SchedulerClient> client_;
};

}  // namespace pscluster::testing

#endif  // PSCLUSTER_TESTS_NETSIM_NETSIM_CLUSTER_H_
