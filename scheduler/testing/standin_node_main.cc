// A stand-in ps_server / ps_worker process for cluster tests of the scheduler and of
// `psctl up --local`: it accepts the flags the launcher passes to the real daemons, serves health
// and the calls the scheduler makes, registers and heartbeats, and (as a worker) reports a
// simulated training run. It trains nothing; the reported numbers come from its flags.
// Built twice: STANDIN_ROLE=2 (server) and STANDIN_ROLE=3 (worker).
#include <signal.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/logging.h"
#include "scheduler/testing/fake_nodes.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve on");
ABSL_FLAG(std::string, port_file, "", "write host:port here once listening");
ABSL_FLAG(std::string, scheduler, "", "scheduler host:port");
ABSL_FLAG(std::string, log_level, "info", "log level");
ABSL_FLAG(std::string, checkpoint_dir, "", "accepted like ps_server's; unused");
ABSL_FLAG(std::string, device, "cpu", "accepted like ps_worker's; unused");
ABSL_FLAG(bool, allow_entrypoints, false,
          "accepted like ps_worker's (psctl up --local passes it); the stand-in runs no command");
ABSL_FLAG(int64_t, standin_steps, 20, "worker: steps of the simulated task");
ABSL_FLAG(int64_t, standin_step_ms, 20, "worker: milliseconds per simulated step");
ABSL_FLAG(int32_t, standin_report_every, 5, "worker: steps between progress reports");
ABSL_FLAG(double, standin_test_accuracy, 0.9, "worker: test accuracy reported at the end");
ABSL_FLAG(int64_t, standin_fail_at_step, -1, "worker: report an error at this step");
ABSL_FLAG(int64_t, standin_heartbeat_ms, 100, "heartbeat interval");

#ifndef STANDIN_ROLE
#error "define STANDIN_ROLE (2 = server, 3 = worker)"
#endif

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!pscluster::SetLogLevel(absl::GetFlag(FLAGS_log_level)).ok()) return 1;
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  namespace t = pscluster::scheduler::testing;
  t::FakeNodeOptions o;
  o.role = static_cast<pscluster::v1::NodeRole>(STANDIN_ROLE);
  o.scheduler_address = absl::GetFlag(FLAGS_scheduler);
  o.listen_address = absl::GetFlag(FLAGS_listen);
  o.port_file = absl::GetFlag(FLAGS_port_file);
  o.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_standin_heartbeat_ms));
  o.capacity.set_cpu_slots(1);
  o.capacity.set_memory_bytes(uint64_t{1} << 30);
  o.training.total_steps = absl::GetFlag(FLAGS_standin_steps);
  o.training.step_time = absl::Milliseconds(absl::GetFlag(FLAGS_standin_step_ms));
  o.training.report_every = absl::GetFlag(FLAGS_standin_report_every);
  o.training.test_accuracy = absl::GetFlag(FLAGS_standin_test_accuracy);
  o.training.fail_at_step = absl::GetFlag(FLAGS_standin_fail_at_step);
  auto node = t::FakeNode::Start(o);
  if (!node.ok()) {
    std::fprintf(stderr, "standin: %s\n", std::string(node.status().message()).c_str());
    return 1;
  }
  int sig = 0;
  sigwait(&stop, &sig);
  (*node)->Stop();
  return 0;
}
