// A cluster network on one machine: each "host" is a Linux network namespace with one link,
// a veth pair whose other end is a port of a bridge (the switch, in a namespace of its own), the
// link shaped in both directions with `tc qdisc ... tbf` to a chosen rate (100mbit, 1gbit,
// 10gbit; "" leaves it unshaped). Hosts get addresses 10.77.0.1, .2, ... (/24) that exist only
// inside these namespaces: nothing is added to the machine's own namespace, and two networks
// (two test runs) never see each other.
//
// There is no delay emulation: `netem` is not available on these machines (the kernel has no
// sch_netem), so links differ in rate only; their latency is a veth's (microseconds).
//
// Cleaning up: every namespace of a network is named netsim-<pid of its creator>-<n>-<host>.
// Destroy() (or the destructor) kills every process inside and deletes the namespaces, which
// takes the links and the bridge with them. Should the creator die first (a test killed by its
// timeout), a guard process it started in a session of its own does the same once its pipe to
// the creator closes; and Create() first sweeps namespaces of creators that no longer run.
//
// Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and iproute2's `ip` and `tc`; CheckSupported() says
// why not where either is missing.
//
//   auto net = netsim::Network::Create();
//   if (!net.ok()) GTEST_SKIP() << net.status();
//   auto a = (*net)->AddHost("server", "1gbit");   // a->address == "10.77.0.1"
//   std::vector<std::string> argv = (*net)->Command("server", {binary, "--listen=10.77.0.1:0"});
//
// Not thread-safe: one thread drives a Network.
#ifndef PSCLUSTER_TESTS_NETSIM_NETSIM_H_
#define PSCLUSTER_TESTS_NETSIM_NETSIM_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pscluster::netsim {

// The output (stdout and stderr together) and exit code of a command run to completion.
struct CommandOutput {
  int exit_code = -1;
  std::string output;
};
// Runs argv[0] (a path) with argv[1..]; never throws.
CommandOutput RunArgv(const std::vector<std::string>& argv);

// Paths of iproute2's tools ("" when missing). The test environment's PATH lacks /usr/sbin, so
// the usual places are searched.
std::string IpBinary();
std::string TcBinary();

// OK where namespaces, veth pairs, a bridge and tbf can be made; otherwise FAILED_PRECONDITION
// saying what is missing (not root, no `ip`, no `tc`, a kernel that refuses one of them). Makes
// and removes a probe namespace.
absl::Status CheckSupported();

// Removes the namespaces of networks whose creator no longer runs (killing what still runs in
// them); returns how many namespaces went.
int SweepStale();

// "100mbit", "1gbit", "10gbit", "250mbit", "" (unshaped) → bits per second (0 for unshaped);
// INVALID_ARGUMENT for anything else.
absl::StatusOr<double> ParseRate(const std::string& rate);

struct Host {
  std::string name;       // As given to AddHost.
  std::string netns;      // The namespace (ip netns exec <netns> ...).
  std::string address;    // IPv4, e.g. "10.77.0.3".
  std::string rate;       // As given ("" = unshaped).
  std::string interface;  // Its side of the link, inside netns ("eth0").
  std::string port;       // The switch's side, inside the switch namespace ("p3").
};

class Network {
 public:
  // Sweeps stale networks, then makes the switch. FAILED_PRECONDITION (from CheckSupported's
  // checks) where namespaces cannot be made.
  static absl::StatusOr<std::unique_ptr<Network>> Create();
  ~Network();  // Destroy().

  // A new host with its link at `rate` (see ParseRate). Host names: letters, digits, '-', '_'.
  absl::StatusOr<Host> AddHost(const std::string& name, const std::string& rate);
  // NOT_FOUND for an unknown name.
  absl::StatusOr<Host> host(const std::string& name) const;
  std::vector<Host> hosts() const;

  // Reshapes a host's link, both directions ("" = unshaped).
  absl::Status SetRate(const std::string& name, const std::string& rate);
  // Takes a host's link down (up = false) or up again at the switch: the cable pulled out at
  // the switch port. The host's packets go nowhere; its TCP connections hang (no reset) until
  // the link is back or their timeouts fire.
  absl::Status SetLinkUp(const std::string& name, bool up);

  // argv that runs `argv` inside the host's namespace (`ip netns exec NS ...`, which execs the
  // program itself, so the pid of a process spawned with it is the program's).
  std::vector<std::string> Command(const std::string& name,
                                   const std::vector<std::string>& argv) const;
  // Moves the calling process into the host's namespace: every socket it opens from then on is
  // the host's. FAILED_PRECONDITION once the process has more than one thread (a thread keeps
  // the namespace it had; call this first thing, before gRPC or anything else starts threads).
  absl::Status Enter(const std::string& name);

  // Kills every process inside the network's namespaces (but this one), deletes them; idempotent.
  // Returns the first failure, having tried everything.
  absl::Status Destroy();

  // The prefix of this network's namespaces ("netsim-<pid>-<n>-").
  const std::string& prefix() const { return prefix_; }

 private:
  Network() = default;
  absl::Status Ip(const std::vector<std::string>& args) const;
  absl::Status Tc(const std::string& netns, const std::vector<std::string>& args) const;
  absl::Status Shape(const std::string& netns, const std::string& dev, double bits) const;

  std::string prefix_;
  std::string switch_ns_;
  std::map<std::string, Host> hosts_;
  std::vector<std::string> order_;  // Host names in the order they were added.
  int guard_fd_ = -1;               // Write end of the guard's pipe.
  pid_t guard_pid_ = -1;
  bool destroyed_ = false;
};

}  // namespace pscluster::netsim

#endif  // PSCLUSTER_TESTS_NETSIM_NETSIM_H_
