// End-to-end cluster fixture: a real pscluster on this machine — the ps_scheduler, ps_server and
// ps_worker binaries (Bazel data deps of the test) started by psctl's LocalCluster as child
// processes on loopback, each binding port 0 and reporting its port — plus what a test needs
// around it: running the psctl binary against it, reading jobs back, asking a worker for its
// status, killing and restarting daemons, and the daemons' log tails for failure messages.
//
// A test that uses it lists these data deps: //scheduler:ps_scheduler, //scheduler:psctl,
// //server:ps_server, //worker:ps_worker.
//
//   auto cluster = E2eCluster::Start("my_test");
//   ASSERT_TRUE(cluster.ok()) << cluster.status();
//   CommandResult r = (*cluster)->Psctl({"submit", (*cluster)->WriteFile("job.yaml", yaml),
//                                        "--wait"});
//
// Not thread-safe; one test thread drives it.
#ifndef PSCLUSTER_TESTS_CLUSTER_E2E_CLUSTER_H_
#define PSCLUSTER_TESTS_CLUSTER_E2E_CLUSTER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/testing/wait_for.h"
#include "proto/ps.grpc.pb.h"
#include "proto/scheduler.pb.h"
#include "proto/worker.pb.h"
#include "scheduler/psctl/client.h"
#include "scheduler/psctl/local_cluster.h"
#include "tests/cluster/scheduler_cluster_fixture.h"

namespace pscluster::testing {

struct E2eClusterOptions {
  int servers = 2;
  int workers = 2;
  // Extra flags per daemon kind (later flags win). The scheduler always gets a short start-up
  // grace (so that an oversized job is refused, not queued, once the nodes are up), a 4 s lease,
  // no rebalancing (shards move only when a test asks) and a /metrics endpoint on port 0; the
  // workers one CPU thread each (the daemons share the machine's cores).
  std::vector<std::string> scheduler_args;
  std::vector<std::string> server_args;
  std::vector<std::string> worker_args;
  absl::Duration startup_timeout = absl::Seconds(60);
  // A secured cluster: the token (role admin) this fixture's own calls to the scheduler send
  // and Psctl() passes as --token_file; the daemons' --token_file and --credential_file go in
  // the *_args above.
  std::string admin_token;
};

// Paths of the real binaries in the test's runfiles.
std::string SchedulerBinary();
std::string ServerBinary();
std::string WorkerBinary();
std::string PsctlBinary();

// A small Fashion-MNIST job (MLP with one hidden layer of `hidden` units, Adam, BSP, 2 servers,
// 2 CPU workers) as YAML; `export_path` may be empty.
std::string FashionJobYaml(const std::string& name, int epochs, const std::string& export_path,
                           int hidden = 64);

// A command running in the background with its output (stdout and stderr) in a file; killed
// when this object goes away.
class BackgroundCommand {
 public:
  static absl::StatusOr<std::unique_ptr<BackgroundCommand>> Start(
      const std::string& binary, const std::vector<std::string>& args,
      const std::string& output_file);
  pid_t pid() const { return proc_->pid(); }
  // The exit code once it has ended.
  std::optional<int> Poll() { return proc_->Poll(); }
  // Waits up to `timeout` for it to end; then its exit code, or -1 (it is killed).
  int Wait(absl::Duration timeout);
  std::string Output() const;

 private:
  BackgroundCommand() = default;
  std::unique_ptr<psctl::Subprocess> proc_;
  std::string output_file_;
};

// A daemon (`binary`, one of the above) started in the background with `args` plus a listen
// address on port 0, info logs and a port file, its log dir/<name>.log; returned once it
// reports its port.
struct StartedDaemon {
  std::unique_ptr<BackgroundCommand> process;
  std::string address;
  std::string log;
};
absl::StatusOr<StartedDaemon> StartDaemonIn(const std::string& dir, const std::string& binary,
                                            const std::string& name,
                                            std::vector<std::string> args);

class E2eCluster {
 public:
  // Starts the cluster in a fresh TestDir(name) and waits until the scheduler lists every server
  // and worker as alive. Errors name the daemon that did not start, with its log's last lines.
  static absl::StatusOr<std::unique_ptr<E2eCluster>> Start(const std::string& name,
                                                           E2eClusterOptions options = {});
  // Stops every process (SIGTERM, then SIGKILL).
  ~E2eCluster();

  const std::string& dir() const { return dir_; }
  const std::string& scheduler_address() const { return cluster_->scheduler_address(); }
  // The processes: "scheduler", "server-1".., "worker-1"..; kill, restart, pids, logs.
  psctl::LocalCluster& processes() { return *cluster_; }

  // Runs the psctl binary with --scheduler=<this cluster> and a 100 ms refresh interval (and the
  // admin token as --token_file, if any, unless `args` carry a --token_file).
  CommandResult Psctl(std::vector<std::string> args,
                      absl::Duration timeout = absl::Seconds(60)) const;
  // The same, in the background (output in dir()/psctl-N.out).
  absl::StatusOr<std::unique_ptr<BackgroundCommand>> StartPsctl(
      std::vector<std::string> args) const;
  // Writes `text` to dir()/name; returns the path.
  std::string WriteFile(const std::string& name, const std::string& text) const;

  // `psctl status JOB -o json`, parsed into the Job message (errors carry psctl's output).
  absl::StatusOr<v1::Job> JobViaPsctl(const std::string& job_id) const;
  // Straight from the scheduler over gRPC (for polling; 5 s deadline).
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) const;
  absl::StatusOr<v1::ShardMap> GetShardMap(const std::string& job_id) const;
  absl::StatusOr<v1::ClusterStatusResponse> ClusterStatus() const;
  // WorkerControl.Status of a worker process ("worker-1").
  absl::StatusOr<v1::WorkerStatus> WorkerStatus(const std::string& name) const;
  // WorkerControl.Status of the worker at `address`.
  static absl::StatusOr<v1::WorkerStatus> WorkerStatusAt(const std::string& address);

  // One more worker or server, started like the cluster's own but registering with `scheduler`
  // (a proxy in front of this cluster's scheduler, say); its log is dir()/<name>.log. Returned
  // once it listens (a server: and registered); it is killed when the returned process goes.
  using ExtraDaemon = StartedDaemon;
  absl::StatusOr<ExtraDaemon> StartWorker(const std::string& name,
                                          const std::string& scheduler) const;
  absl::StatusOr<ExtraDaemon> StartServer(const std::string& name,
                                          const std::string& scheduler) const;
  // ParameterServer.Status of a server process ("server-1").
  absl::StatusOr<v1::ServerStatus> ServerStatus(const std::string& name) const;
  // ParameterServer.Status of the server at `address`.
  static absl::StatusOr<v1::ServerStatus> ServerStatusAt(const std::string& address);

  // The scheduler's Prometheus page (GET /metrics on the port its log names).
  absl::StatusOr<std::string> SchedulerMetrics() const;

  // Waits until the job is in a final state; returns it (DEADLINE_EXCEEDED with its last state).
  absl::StatusOr<v1::Job> WaitForEnd(const std::string& job_id, absl::Duration timeout) const;

  // The last `lines` lines of every daemon's log, for failure messages.
  std::string LogTails(int lines = 25) const;

 private:
  E2eCluster() = default;

  std::string dir_;
  std::string admin_token_file_;
  std::unique_ptr<psctl::LocalCluster> cluster_;
  std::unique_ptr<psctl::SchedulerClient> client_;
};

}  // namespace pscluster::testing

#endif  // PSCLUSTER_TESTS_CLUSTER_E2E_CLUSTER_H_
