// netsim: the network harness as a command, for people.
//
//   netsim check                       # can namespaces, veth, a bridge and tbf be made here?
//   netsim sweep                       # remove networks whose creator no longer runs
//   netsim up --hosts=sched,server,worker --rate=1gbit [--rates=server=100mbit,...]
//       # makes the network, prints each host's namespace and address and the command to run
//       # a program there, and holds it until Ctrl-C or SIGTERM, then removes it (with whatever
//       # still runs inside)
//
// Needs root. Links are shaped with tc tbf (no delay emulation: netem is not available).
#include <signal.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/netsim/netsim.h"

ABSL_FLAG(std::string, hosts, "", "up: host names, comma-separated");
ABSL_FLAG(std::string, rate, "1gbit",
          "up: every host's link rate (100mbit, 1gbit, 10gbit; "
          "empty = unshaped)");
ABSL_FLAG(std::string, rates, "", "up: per-host rates overriding --rate, HOST=RATE,...");

namespace {

int Up() {
  std::vector<std::string> names =
      absl::StrSplit(absl::GetFlag(FLAGS_hosts), ',', absl::SkipEmpty());
  if (names.empty()) {
    fprintf(stderr, "netsim up: --hosts names no host\n");
    return 2;
  }
  std::map<std::string, std::string> rates;
  for (absl::string_view kv : absl::StrSplit(absl::GetFlag(FLAGS_rates), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    rates[p.first] = p.second;
  }
  // Signals are taken synchronously below; blocked before anything else runs.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGHUP);
  sigprocmask(SIG_BLOCK, &stop, nullptr);
  auto net = pscluster::netsim::Network::Create();
  if (!net.ok()) {
    fprintf(stderr, "netsim up: %s\n", net.status().ToString().c_str());
    return 1;
  }
  for (const std::string& n : names) {
    const std::string rate = rates.count(n) ? rates[n] : absl::GetFlag(FLAGS_rate);
    auto h = (*net)->AddHost(n, rate);
    if (!h.ok()) {
      fprintf(stderr, "netsim up: %s\n", h.status().ToString().c_str());
      return 1;
    }
    printf("%-16s %-12s %-10s ip netns exec %s PROGRAM...\n", h->name.c_str(), h->address.c_str(),
           h->rate.empty() ? "unshaped" : h->rate.c_str(), h->netns.c_str());
  }
  printf("network up (namespaces %s*); Ctrl-C removes it\n", (*net)->prefix().c_str());
  fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  absl::Status st = (*net)->Destroy();
  printf("network removed%s\n", st.ok() ? "" : (": " + st.ToString()).c_str());
  return st.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("netsim check | sweep | up --hosts=a,b --rate=1gbit");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string cmd = args.size() > 1 ? args[1] : "";
  if (cmd == "check") {
    absl::Status st = pscluster::netsim::CheckSupported();
    printf("%s\n", st.ok() ? "netsim: namespaces, veth pairs, a bridge and tbf work here (no "
                             "netem: rates only, no delay emulation)"
                           : st.ToString().c_str());
    return st.ok() ? 0 : 1;
  }
  if (cmd == "sweep") {
    printf("netsim: removed %d stale namespaces\n", pscluster::netsim::SweepStale());
    return 0;
  }
  if (cmd == "up") return Up();
  fprintf(stderr,
          "usage: netsim check | sweep | up --hosts=a,b,c [--rate=1gbit] "
          "[--rates=b=100mbit]\n");
  return 2;
}
