#include "tests/netsim/netsim.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace pscluster::netsim {
namespace {

constexpr char kNamePrefix[] = "netsim-";
constexpr char kSubnet[] = "10.77.0.";  // /24: hosts .1 .. .254.
constexpr char kBridge[] = "br0";
constexpr char kHostInterface[] = "eth0";

std::string FindTool(const char* name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    std::string p = absl::StrCat(dir, name);
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

std::string Errno() { return strerror(errno); }

// Names of the namespaces that exist now.
std::vector<std::string> ListNamespaces() {
  std::vector<std::string> out;
  CommandOutput r = RunArgv({IpBinary(), "netns", "list"});
  if (r.exit_code != 0) return out;
  for (absl::string_view line : absl::StrSplit(r.output, '\n', absl::SkipEmpty())) {
    // "NAME" or "NAME (id: 3)".
    out.emplace_back(line.substr(0, line.find(' ')));
  }
  return out;
}

// Kills every process in `netns` but this one; then deletes it. Returns the failure, if any.
absl::Status KillAndDelete(const std::string& netns) {
  const std::string ip = IpBinary();
  // A process may fork while we kill; a few passes catch its children.
  for (int pass = 0; pass < 5; ++pass) {
    CommandOutput pids = RunArgv({ip, "netns", "pids", netns});
    if (pids.exit_code != 0) break;  // Gone already.
    int killed = 0;
    for (absl::string_view p : absl::StrSplit(pids.output, '\n', absl::SkipEmpty())) {
      int pid = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(p), &pid) || pid == getpid()) continue;
      if (kill(pid, SIGKILL) == 0) ++killed;
    }
    if (killed == 0) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  CommandOutput del = RunArgv({ip, "netns", "del", netns});
  if (del.exit_code != 0 && absl::StrContains(del.output, "No such file")) return absl::OkStatus();
  if (del.exit_code != 0) {
    return absl::InternalError(absl::StrCat("ip netns del ", netns, ": ", del.output));
  }
  return absl::OkStatus();
}

// The creator's pid from a namespace name "netsim-<pid>-...", or 0.
pid_t OwnerOf(absl::string_view netns) {
  if (!absl::ConsumePrefix(&netns, kNamePrefix)) return 0;
  int pid = 0;
  if (!absl::SimpleAtoi(netns.substr(0, netns.find('-')), &pid)) return 0;
  return pid;
}

int ThreadsOfThisProcess() {
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

bool ValidHostName(const std::string& name) {
  return !name.empty() && name.size() <= 32 && std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
}

}  // namespace

CommandOutput RunArgv(const std::vector<std::string>& argv) {
  CommandOutput out;
  if (argv.empty() || argv[0].empty()) {
    out.output = "no program to run";
    return out;
  }
  std::vector<std::string> copy = argv;
  std::vector<char*> args;
  for (std::string& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    out.output = "pipe: " + Errno();
    return out;
  }
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t pid = fork();
  if (pid < 0) {
    out.output = "fork: " + Errno();
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    if (null_fd >= 0) close(null_fd);
    return out;
  }
  if (pid == 0) {
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(pipe_fds[1], 1);
    dup2(pipe_fds[1], 2);
    execv(args[0], args.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  if (null_fd >= 0) close(null_fd);
  char buf[4096];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.output.append(buf, n);
  }
  close(pipe_fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

std::string IpBinary() {
  static const std::string path = FindTool("ip");
  return path;
}

std::string TcBinary() {
  static const std::string path = FindTool("tc");
  return path;
}

absl::StatusOr<double> ParseRate(const std::string& rate) {
  if (rate.empty()) return 0.0;
  absl::string_view r = rate;
  double unit = 0;
  if (absl::ConsumeSuffix(&r, "gbit")) {
    unit = 1e9;
  } else if (absl::ConsumeSuffix(&r, "mbit")) {
    unit = 1e6;
  } else if (absl::ConsumeSuffix(&r, "kbit")) {
    unit = 1e3;
  }
  double v = 0;
  if (unit == 0 || !absl::SimpleAtod(r, &v) || !(v > 0) || v * unit > 400e9) {
    return absl::InvalidArgumentError(
        absl::StrCat("link rate '", rate,
                     "' must be a number with kbit, mbit or gbit (100mbit, 1gbit, "
                     "10gbit), or empty for an unshaped link"));
  }
  return v * unit;
}

absl::Status CheckSupported() {
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "netsim needs root to make network namespaces (running as uid ", geteuid(), ")"));
  }
  if (IpBinary().empty() || TcBinary().empty()) {
    return absl::FailedPreconditionError(
        "netsim needs iproute2's `ip` and `tc` (not found in /usr/sbin, /sbin, /usr/bin, /bin): "
        "apt-get install iproute2");
  }
  static const absl::Status* probed = [] {
    const std::string ns = absl::StrCat(kNamePrefix, getpid(), "-probe");
    const std::string ip = IpBinary();
    std::vector<std::vector<std::string>> steps = {
        {ip, "netns", "add", ns},
        {ip, "-n", ns, "link", "add", "name", kBridge, "type", "bridge"},
        {ip, "-n", ns, "link", "add", "name", "probe0", "type", "veth", "peer", "name", "probe1"},
        {ip, "-n", ns, "link", "set", "probe1", "master", kBridge},
        {TcBinary(), "-n", ns, "qdisc", "add", "dev", "probe0", "root", "tbf", "rate", "100mbit",
         "burst", "131072", "latency", "20ms"},
    };
    absl::Status st;
    for (const auto& step : steps) {
      CommandOutput r = RunArgv(step);
      if (r.exit_code != 0) {
        st = absl::FailedPreconditionError(
            absl::StrCat("netsim cannot make its network here: `",
                         absl::StrJoin(step.begin() + 1, step.end(), " "),
                         "` failed: ", absl::StripAsciiWhitespace(r.output)));
        break;
      }
    }
    RunArgv({ip, "netns", "del", ns});
    return new absl::Status(st);
  }();
  return *probed;
}

int SweepStale() {
  if (IpBinary().empty()) return 0;
  int removed = 0;
  for (const std::string& ns : ListNamespaces()) {
    const pid_t owner = OwnerOf(ns);
    if (owner <= 0 || owner == getpid()) continue;
    if (kill(owner, 0) == 0 || errno != ESRCH) continue;  // Still running (or not ours to ask).
    if (KillAndDelete(ns).ok()) ++removed;
  }
  return removed;
}

absl::StatusOr<std::unique_ptr<Network>> Network::Create() {
  absl::Status st = CheckSupported();
  if (!st.ok()) return st;
  SweepStale();
  static int counter = 0;
  std::unique_ptr<Network> net(new Network());
  net->prefix_ = absl::StrCat(kNamePrefix, getpid(), "-", ++counter, "-");
  net->switch_ns_ = net->prefix_ + "switch";

  // The guard: a shell in a session of its own (a test's timeout kills the test's process group,
  // not it) that waits for its stdin, a pipe whose only writer is this process, to close, then
  // removes whatever is left of this network.
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe: " + Errno());
  const std::string script =
      "read -r _; for ns in $(\"$1\" netns list | cut -d' ' -f1); do case \"$ns\" in "
      "\"$2\"*) for p in $(\"$1\" netns pids \"$ns\"); do kill -9 \"$p\"; done; "
      "\"$1\" netns del \"$ns\";; esac; done";
  std::vector<std::string> argv_s = {"/bin/sh",      "-c",       script,
                                     "netsim-guard", IpBinary(), net->prefix_};
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError("fork: " + Errno());
  }
  if (pid == 0) {
    setsid();
    dup2(fds[0], 0);
    if (null_fd >= 0) {
      dup2(null_fd, 1);
      dup2(null_fd, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[0]);
  if (null_fd >= 0) close(null_fd);
  net->guard_fd_ = fds[1];
  net->guard_pid_ = pid;

  st = net->Ip({"netns", "add", net->switch_ns_});
  if (st.ok())
    st = net->Ip({"-n", net->switch_ns_, "link", "add", "name", kBridge, "type", "bridge"});
  if (st.ok()) st = net->Ip({"-n", net->switch_ns_, "link", "set", kBridge, "up"});
  if (!st.ok()) return st;  // The destructor removes what was made.
  return net;
}

Network::~Network() { (void)Destroy(); }

absl::Status Network::Ip(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {IpBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandOutput r = RunArgv(argv);
  if (r.exit_code == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("ip ", absl::StrJoin(args, " "), ": ", absl::StripAsciiWhitespace(r.output)));
}

absl::Status Network::Tc(const std::string& netns, const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {TcBinary(), "-n", netns};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandOutput r = RunArgv(argv);
  if (r.exit_code == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("tc -n ", netns, " ", absl::StrJoin(args, " "), ": ",
                                          absl::StripAsciiWhitespace(r.output)));
}

// tbf as the root qdisc of `dev` (its egress). The bucket holds at least 4 ms at the rate and
// never less than 128 KiB, so that one segment of a veth's 64 KiB offloads always fits; the
// queue holds 20 ms more before it drops.
absl::Status Network::Shape(const std::string& netns, const std::string& dev, double bits) const {
  if (bits <= 0) {
    (void)Tc(netns, {"qdisc", "del", "dev", dev, "root"});  // None there is fine.
    return absl::OkStatus();
  }
  const double burst = std::max(131072.0, bits / 8 * 0.004);
  return Tc(netns, {"qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                    absl::StrCat(static_cast<uint64_t>(std::llround(bits)), "bit"), "burst",
                    absl::StrCat(static_cast<uint64_t>(burst)), "latency", "20ms"});
}

absl::StatusOr<Host> Network::AddHost(const std::string& name, const std::string& rate) {
  if (destroyed_) return absl::FailedPreconditionError("the network was destroyed");
  if (!ValidHostName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("host name '", name, "' must be 1-32 letters, digits, '-' or '_'"));
  }
  if (hosts_.count(name)) {
    return absl::AlreadyExistsError(absl::StrCat("host '", name, "' exists already"));
  }
  if (hosts_.size() >= 254) return absl::ResourceExhaustedError("254 hosts at most");
  auto bits = ParseRate(rate);
  if (!bits.ok()) return bits.status();
  const int n = static_cast<int>(hosts_.size()) + 1;
  Host h;
  h.name = name;
  h.netns = absl::StrCat(prefix_, "h-", name);
  h.address = absl::StrCat(kSubnet, n);
  h.rate = rate;
  h.interface = kHostInterface;
  h.port = absl::StrCat("p", n);
  // Recorded first, so that Destroy() removes a half-made host too.
  hosts_[name] = h;
  order_.push_back(name);
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"netns", "add", h.netns},
           {"-n", h.netns, "link", "set", "lo", "up"},
           {"-n", h.netns, "link", "add", "name", h.interface, "type", "veth", "peer", "name",
            h.port, "netns", switch_ns_},
           {"-n", switch_ns_, "link", "set", h.port, "master", kBridge},
           {"-n", switch_ns_, "link", "set", h.port, "up"},
           {"-n", h.netns, "addr", "add", h.address + "/24", "dev", h.interface},
           {"-n", h.netns, "link", "set", h.interface, "up"},
       }) {
    absl::Status st = Ip(args);
    if (!st.ok()) return st;
  }
  absl::Status st = Shape(h.netns, h.interface, *bits);
  if (st.ok()) st = Shape(switch_ns_, h.port, *bits);
  if (!st.ok()) return st;
  return h;
}

absl::StatusOr<Host> Network::host(const std::string& name) const {
  auto it = hosts_.find(name);
  if (it == hosts_.end()) return absl::NotFoundError(absl::StrCat("no host '", name, "'"));
  return it->second;
}

std::vector<Host> Network::hosts() const {
  std::vector<Host> out;
  for (const std::string& n : order_) out.push_back(hosts_.at(n));
  return out;
}

absl::Status Network::SetRate(const std::string& name, const std::string& rate) {
  auto h = host(name);
  if (!h.ok()) return h.status();
  auto bits = ParseRate(rate);
  if (!bits.ok()) return bits.status();
  absl::Status st = Shape(h->netns, h->interface, *bits);
  if (st.ok()) st = Shape(switch_ns_, h->port, *bits);
  if (st.ok()) hosts_[name].rate = rate;
  return st;
}

absl::Status Network::SetLinkUp(const std::string& name, bool up) {
  auto h = host(name);
  if (!h.ok()) return h.status();
  return Ip({"-n", switch_ns_, "link", "set", h->port, up ? "up" : "down"});
}

std::vector<std::string> Network::Command(const std::string& name,
                                          const std::vector<std::string>& argv) const {
  auto it = hosts_.find(name);
  std::vector<std::string> out = {IpBinary(), "netns", "exec",
                                  it == hosts_.end() ? "no-such-host" : it->second.netns};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::Status Network::Enter(const std::string& name) {
  auto h = host(name);
  if (!h.ok()) return h.status();
  const int threads = ThreadsOfThisProcess();
  if (threads != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot move this process into host '", name, "': it has ", threads,
                     " threads, and each keeps the namespace it has (enter before starting any)"));
  }
  const std::string path = "/run/netns/" + h->netns;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", Errno()));
  const int rc = setns(fd, CLONE_NEWNET);
  const std::string err = Errno();
  close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat("setns into ", h->netns, ": ", err));
  return absl::OkStatus();
}

absl::Status Network::Destroy() {
  if (destroyed_) return absl::OkStatus();
  destroyed_ = true;
  absl::Status first;
  // Hosts first (their processes, then their ends of the links), the switch last.
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    absl::Status st = KillAndDelete(hosts_[*it].netns);
    if (first.ok()) first = st;
  }
  absl::Status st = KillAndDelete(switch_ns_);
  if (first.ok()) first = st;
  if (guard_fd_ >= 0) {
    close(guard_fd_);  // The guard finds nothing left and exits.
    guard_fd_ = -1;
    int status;
    while (waitpid(guard_pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  return first;
}

}  // namespace pscluster::netsim
