// A real etcd cluster for tests: N members of Debian's etcd (3.4) on loopback, each with its data
// directory and log under `dir`, started as child processes and stopped when this goes away.
// Members can be killed, paused (SIGSTOP: a member, or the whole cluster, that stops answering)
// and resumed.
//
//   auto etcd = EtcdCluster::Start(TestTmpDir("x"), 3);
//   ASSERT_TRUE(etcd.ok()) << etcd.status();
//   ps_scheduler --etcd_endpoints=(*etcd)->endpoints()
//
// Not thread-safe.
#ifndef PSCLUSTER_SCHEDULER_TESTING_ETCD_CLUSTER_H_
#define PSCLUSTER_SCHEDULER_TESTING_ETCD_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "scheduler/psctl/subprocess.h"

namespace pscluster::scheduler::testing {

// TLS on the members' client URLs (https), and what the harness connects with.
struct EtcdTls {
  std::string cert, key;  // The members' certificate (naming 127.0.0.1) and its key.
  // --trusted-ca-file with --client-cert-auth: clients must present a certificate it signed.
  // Empty: no client certificates asked for.
  std::string client_ca;
  TlsFiles client;  // The harness's own connection (CA of `cert`, and a client certificate).
};

class EtcdCluster {
 public:
  // Starts `members` members and waits until the cluster answers reads and writes. Errors name
  // the member that did not come up, with its log's last lines (and say so when etcd is not
  // installed).
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(const std::string& dir, int members,
                                                            absl::Duration timeout = absl::Seconds(60),
                                                            const EtcdTls* tls = nullptr);
  ~EtcdCluster();

  // Every member's client address, comma-separated ("127.0.0.1:P1,127.0.0.1:P2,...").
  std::string endpoints() const;
  const std::string& endpoint(int i) const { return members_[i].client; }
  int size() const { return static_cast<int>(members_.size()); }

  void Kill(int i);    // SIGKILL; the member stays down.
  void Pause(int i);   // SIGSTOP.
  void Resume(int i);  // SIGCONT.
  std::string LogTail(int i, int lines = 20) const;

 private:
  struct Member {
    std::string name;
    std::string client;  // host:port
    std::string log;
    std::unique_ptr<psctl::Subprocess> process;
  };
  EtcdCluster() = default;
  std::vector<Member> members_;
};

// The etcd binary ("/usr/bin/etcd", or $PSCLUSTER_ETCD).
std::string EtcdBinary();

}  // namespace pscluster::scheduler::testing

#endif  // PSCLUSTER_SCHEDULER_TESTING_ETCD_CLUSTER_H_
