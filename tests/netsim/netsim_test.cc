// The network harness itself: hosts reach each other only through their links, a link carries
// no more than its rate in either direction, a link taken down carries nothing until it is up
// again, no address or interface appears outside the namespaces, and nothing is left behind —
// by Destroy(), by the guard when the creator is killed, by the sweep of a later run.
//
// Needs root and iproute2 (skips, saying why, elsewhere). Sockets are opened by forked children
// that enter a host's namespace (a fork has one thread), never by the test process itself.

#include "tests/netsim/netsim.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace pscluster::netsim {
namespace {

constexpr int kPort = 5001;

#define SKIP_UNLESS_SUPPORTED()                                           \
  do {                                                                    \
    absl::Status why = CheckSupported();                                  \
    if (!why.ok()) GTEST_SKIP() << "no network namespaces here: " << why; \
  } while (0)

// Runs `fn` in a forked child inside `host`; the child's exit code is fn's.
pid_t ForkIn(Network& net, const std::string& host, std::function<int()> fn) {
  pid_t pid = fork();
  if (pid == 0) {
    if (!net.Enter(host).ok()) _exit(100);
    _exit(fn());
  }
  return pid;
}

int WaitExit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

sockaddr_in Addr(const std::string& ip, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
  return sa;
}

// Connects within `timeout_ms`; the socket or -1.
int ConnectWithin(const std::string& ip, int port, int timeout_ms) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in sa = Addr(ip, port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  int err = 0;
  socklen_t len = sizeof(err);
  if (poll(&p, 1, timeout_ms) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 ||
      err != 0) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, 0);
  return fd;
}

// A receiver in `to` accepting one connection, a sender in `from` writing for `seconds`; the
// rate the receiver saw, in bits per second (-1 on failure).
double MeasureRate(Network& net, const std::string& from, const std::string& to, double seconds) {
  const std::string to_ip = net.host(to)->address;
  int result[2];
  if (pipe(result) != 0) return -1;
  pid_t rx = ForkIn(net, to, [&] {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sa = Addr(to_ip, kPort);
    if (bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(l, 1) != 0) return 1;
    int c = accept(l, nullptr, nullptr);
    static char buf[1 << 20];
    double bytes = 0;
    absl::Time first = absl::InfiniteFuture(), last = absl::InfinitePast();
    for (ssize_t n; (n = read(c, buf, sizeof(buf))) > 0;) {
      if (first == absl::InfiniteFuture()) first = absl::Now();
      last = absl::Now();
      bytes += n;
    }
    double bits = bytes * 8 / absl::ToDoubleSeconds(last - first);
    return write(result[1], &bits, sizeof(bits)) == sizeof(bits) ? 0 : 2;
  });
  pid_t tx = ForkIn(net, from, [&] {
    int fd = -1;
    for (int i = 0; i < 100 && fd < 0; ++i) {
      fd = ConnectWithin(to_ip, kPort, 1000);
      if (fd < 0) absl::SleepFor(absl::Milliseconds(20));
    }
    if (fd < 0) return 1;
    static char buf[1 << 20];
    absl::Time end = absl::Now() + absl::Seconds(seconds);
    while (absl::Now() < end) {
      if (write(fd, buf, sizeof(buf)) < 0) return 2;
    }
    close(fd);
    return 0;
  });
  close(result[1]);
  double bits = -1;
  EXPECT_EQ(WaitExit(tx), 0);
  EXPECT_EQ(WaitExit(rx), 0);
  if (read(result[0], &bits, sizeof(bits)) != sizeof(bits)) bits = -1;
  close(result[0]);
  return bits;
}

bool NamespacesWithPrefix(const std::string& prefix) {
  CommandOutput r = RunArgv({IpBinary(), "netns", "list"});
  return absl::StrContains(r.output, prefix);
}

TEST(ParseRateTest, TakesTcUnitsAndRefusesTheRest) {
  EXPECT_EQ(*ParseRate("100mbit"), 100e6);
  EXPECT_EQ(*ParseRate("1gbit"), 1e9);
  EXPECT_EQ(*ParseRate("10gbit"), 10e9);
  EXPECT_EQ(*ParseRate("2.5gbit"), 2.5e9);
  EXPECT_EQ(*ParseRate(""), 0);
  for (const char* bad : {"100", "1gb", "fast", "-1gbit", "0mbit", "1000gbit"}) {
    EXPECT_EQ(ParseRate(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(NetsimTest, EachLinkCarriesItsRateInBothDirections) {
  SKIP_UNLESS_SUPPORTED();
  auto net = Network::Create();
  ASSERT_TRUE(net.ok()) << net.status();
  auto slow = (*net)->AddHost("slow", "100mbit");
  auto fast = (*net)->AddHost("fast", "1gbit");
  ASSERT_TRUE(slow.ok()) << slow.status();
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_EQ(slow->address, "10.77.0.1");
  EXPECT_EQ(fast->address, "10.77.0.2");
  // Up from the slow host and down to it: its link is the bottleneck both ways. A shaped link
  // never carries more than its rate; what TCP gets of it depends on the machine's load, so the
  // lower bound is loose.
  const double up = MeasureRate(**net, "slow", "fast", 1.5);
  const double down = MeasureRate(**net, "fast", "slow", 1.5);
  EXPECT_LE(up, 100e6 * 1.05);
  EXPECT_GE(up, 100e6 * 0.5);
  EXPECT_LE(down, 100e6 * 1.05);
  EXPECT_GE(down, 100e6 * 0.5);
  // Reshaped in place.
  ASSERT_TRUE((*net)->SetRate("slow", "50mbit").ok());
  const double reshaped = MeasureRate(**net, "slow", "fast", 1.5);
  EXPECT_LE(reshaped, 50e6 * 1.05);
  EXPECT_GE(reshaped, 50e6 * 0.5);
  printf("100mbit link: up %.1f Mbit/s, down %.1f Mbit/s; reshaped to 50mbit: %.1f Mbit/s\n",
         up / 1e6, down / 1e6, reshaped / 1e6);
}

TEST(NetsimTest, AddressesAndLinksExistOnlyInsideTheNamespaces) {
  SKIP_UNLESS_SUPPORTED();
  auto net = Network::Create();
  ASSERT_TRUE(net.ok()) << net.status();
  ASSERT_TRUE((*net)->AddHost("a", "").ok());
  CommandOutput addrs = RunArgv({IpBinary(), "-o", "addr"});
  EXPECT_FALSE(absl::StrContains(addrs.output, "10.77.0.")) << addrs.output;
  CommandOutput links = RunArgv({IpBinary(), "-o", "link"});
  EXPECT_FALSE(absl::StrContains(links.output, " p1")) << links.output;
  EXPECT_FALSE(absl::StrContains(links.output, " br0")) << links.output;
  // Inside, the host has its address.
  CommandOutput inside = RunArgv((*net)->Command("a", {IpBinary(), "-o", "addr"}));
  EXPECT_TRUE(absl::StrContains(inside.output, "10.77.0.1/24")) << inside.output;
}

TEST(NetsimTest, ALinkTakenDownCarriesNothingUntilItIsUpAgain) {
  SKIP_UNLESS_SUPPORTED();
  auto net = Network::Create();
  ASSERT_TRUE(net.ok()) << net.status();
  ASSERT_TRUE((*net)->AddHost("a", "1gbit").ok());
  ASSERT_TRUE((*net)->AddHost("b", "1gbit").ok());
  auto try_connect = [&](int timeout_ms) {
    pid_t l = ForkIn(**net, "b", [&] {
      int s = socket(AF_INET, SOCK_STREAM, 0);
      int one = 1;
      setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      sockaddr_in sa = Addr("10.77.0.2", kPort);
      bind(s, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
      listen(s, 1);
      pause();
      return 0;
    });
    absl::SleepFor(absl::Milliseconds(100));
    pid_t c = ForkIn(**net, "a", [&] {
      int fd = ConnectWithin("10.77.0.2", kPort, timeout_ms);
      return fd >= 0 ? 0 : 1;
    });
    const int rc = WaitExit(c);
    kill(l, SIGKILL);
    WaitExit(l);
    return rc == 0;
  };
  EXPECT_TRUE(try_connect(2000));
  ASSERT_TRUE((*net)->SetLinkUp("b", false).ok());
  EXPECT_FALSE(try_connect(1000));
  ASSERT_TRUE((*net)->SetLinkUp("b", true).ok());
  EXPECT_TRUE(try_connect(5000));
}

TEST(NetsimTest, DestroyKillsWhatRunsInsideAndRemovesTheNamespaces) {
  SKIP_UNLESS_SUPPORTED();
  auto net = Network::Create();
  ASSERT_TRUE(net.ok()) << net.status();
  ASSERT_TRUE((*net)->AddHost("a", "100mbit").ok());
  const std::string prefix = (*net)->prefix();
  std::vector<std::string> argv = (*net)->Command("a", {"/bin/sleep", "1000"});
  pid_t sleeper = fork();
  if (sleeper == 0) {
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  // Wait until it runs inside.
  for (int i = 0; i < 100; ++i) {
    if (!RunArgv({IpBinary(), "netns", "pids", (*net)->host("a")->netns}).output.empty()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(NamespacesWithPrefix(prefix));
  EXPECT_TRUE((*net)->Destroy().ok());
  EXPECT_EQ(WaitExit(sleeper), 128 + SIGKILL);
  EXPECT_FALSE(NamespacesWithPrefix(prefix));
}

TEST(NetsimTest, TheGuardCleansUpAfterAKilledCreator) {
  SKIP_UNLESS_SUPPORTED();
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t creator = fork();
  if (creator == 0) {
    auto net = Network::Create();
    if (!net.ok() || !(*net)->AddHost("a", "1gbit").ok()) _exit(1);
    std::string prefix = (*net)->prefix() + "\n";
    (void)!write(fds[1], prefix.data(), prefix.size());
    pause();
    _exit(0);
  }
  close(fds[1]);
  char buf[256] = {};
  ASSERT_GT(read(fds[0], buf, sizeof(buf) - 1), 0);
  close(fds[0]);
  const std::string prefix(buf, strchr(buf, '\n'));
  EXPECT_TRUE(NamespacesWithPrefix(prefix));
  kill(creator, SIGKILL);
  WaitExit(creator);
  bool gone = false;
  for (int i = 0; i < 250 && !gone; ++i) {
    gone = !NamespacesWithPrefix(prefix);
    if (!gone) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(gone) << RunArgv({IpBinary(), "netns", "list"}).output;
}

TEST(NetsimTest, TheSweepRemovesNamespacesOfCreatorsThatAreGone) {
  SKIP_UNLESS_SUPPORTED();
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  WaitExit(dead);
  const std::string stale = absl::StrCat("netsim-", dead, "-1-h-left");
  ASSERT_EQ(RunArgv({IpBinary(), "netns", "add", stale}).exit_code, 0);
  EXPECT_GE(SweepStale(), 1);
  EXPECT_FALSE(NamespacesWithPrefix(stale));
}

}  // namespace
}  // namespace pscluster::netsim
