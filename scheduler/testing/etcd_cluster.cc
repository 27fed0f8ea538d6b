#include "scheduler/testing/etcd_cluster.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "scheduler/etcd_client.h"

namespace pscluster::scheduler::testing {
namespace {

// A loopback port free right now (etcd needs its ports on the command line).
int FreePort() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(s);
  return port;
}

}  // namespace

std::string EtcdBinary() {
  const char* env = std::getenv("PSCLUSTER_ETCD");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/etcd";
}

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(const std::string& dir,
                                                                int members,
                                                                absl::Duration timeout,
                                                                const EtcdTls* tls) {
  if (access(EtcdBinary().c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(
        EtcdBinary(), " is not installed (Debian package etcd-server; deploy/install_deps.sh)"));
  }
  std::unique_ptr<EtcdCluster> c(new EtcdCluster());
  std::vector<std::string> peers, initial;
  for (int i = 0; i < members; ++i) {
    Member m;
    m.name = absl::StrCat("etcd", i + 1);
    m.client = absl::StrCat("127.0.0.1:", FreePort());
    peers.push_back(absl::StrCat("http://127.0.0.1:", FreePort()));
    initial.push_back(absl::StrCat(m.name, "=", peers.back()));
    m.log = absl::StrCat(dir, "/", m.name, ".log");
    c->members_.push_back(std::move(m));
  }
  const std::string cluster = absl::StrJoin(initial, ",");
  for (int i = 0; i < members; ++i) {
    Member& m = c->members_[i];
    psctl::SpawnOptions o;
    o.binary = EtcdBinary();
    o.log_file = m.log;
    o.args = {absl::StrCat("--name=", m.name),
              absl::StrCat("--data-dir=", dir, "/", m.name, ".data"),
              absl::StrCat("--listen-client-urls=", tls ? "https://" : "http://", m.client),
              absl::StrCat("--advertise-client-urls=", tls ? "https://" : "http://", m.client),
              absl::StrCat("--listen-peer-urls=", peers[i]),
              absl::StrCat("--initial-advertise-peer-urls=", peers[i]),
              absl::StrCat("--initial-cluster=", cluster),
              "--initial-cluster-state=new",
              "--initial-cluster-token=pscluster-test",
              // Quick raft failover: a lost member that led is replaced in about a second.
              "--heartbeat-interval=50",
              "--election-timeout=500"};
    if (tls != nullptr) {
      o.args.push_back(absl::StrCat("--cert-file=", tls->cert));
      o.args.push_back(absl::StrCat("--key-file=", tls->key));
      if (!tls->client_ca.empty()) {
        o.args.push_back("--client-cert-auth");
        o.args.push_back(absl::StrCat("--trusted-ca-file=", tls->client_ca));
      }
    }
    auto p = psctl::Subprocess::Spawn(o);
    if (!p.ok()) return p.status();
    m.process = std::move(*p);
  }
  // Up once a write through each member's address goes through.
  const absl::Time deadline = absl::Now() + timeout;
  for (int i = 0; i < members; ++i) {
    auto client = EtcdClient::Connect(c->members_[i].client, absl::Seconds(1),
                                      tls != nullptr ? tls->client : TlsFiles{});
    if (!client.ok()) return client.status();
    absl::Status s;
    while (true) {
      s = (*client)->Put("/pscluster-test/up", c->members_[i].name);
      if (s.ok()) break;
      if (c->members_[i].process->Poll().has_value() || absl::Now() > deadline) {
        return absl::UnavailableError(absl::StrCat("etcd member ", c->members_[i].name, " at ",
                                                   c->members_[i].client, " did not come up: ",
                                                   s.message(), "\n", c->LogTail(i)));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  return c;
}

EtcdCluster::~EtcdCluster() {
  for (Member& m : members_) {
    if (m.process == nullptr) continue;
    kill(m.process->pid(), SIGCONT);
    m.process->Terminate(absl::Seconds(5));
  }
}

std::string EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (const Member& m : members_) out.push_back(m.client);
  return absl::StrJoin(out, ",");
}

void EtcdCluster::Kill(int i) {
  kill(members_[i].process->pid(), SIGKILL);
  members_[i].process->Poll();
}

void EtcdCluster::Pause(int i) { kill(members_[i].process->pid(), SIGSTOP); }
void EtcdCluster::Resume(int i) { kill(members_[i].process->pid(), SIGCONT); }

std::string EtcdCluster::LogTail(int i, int lines) const {
  std::ifstream in(members_[i].log);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<std::string> all = absl::StrSplit(ss.str(), '\n');
  const size_t from = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  return absl::StrJoin(all.begin() + from, all.end(), "\n");
}

}  // namespace pscluster::scheduler::testing
