// A TCP forwarder on loopback that a test can cut, to put a network partition between two
// daemons: point one daemon at the proxy instead of its peer, then Cut() and Heal().
//
//   auto proxy = TcpProxy::Start(scheduler_address);
//   // start a worker with --scheduler=(*proxy)->address() ...
//   (*proxy)->Cut();   // the worker can no longer reach the scheduler
//   (*proxy)->Heal();  // it can again
//
// Thread-safe. One thread accepts; each forwarded connection has a thread that copies bytes
// both ways.
#ifndef PSCLUSTER_TESTS_CLUSTER_TCP_PROXY_H_
#define PSCLUSTER_TESTS_CLUSTER_TCP_PROXY_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pscluster::testing {

class TcpProxy {
 public:
  // Listens on 127.0.0.1 (any free port) and forwards every connection to `upstream`
  // ("host:port", IPv4).
  static absl::StatusOr<std::unique_ptr<TcpProxy>> Start(const std::string& upstream);
  ~TcpProxy();

  // "127.0.0.1:port".
  std::string address() const;
  // The partition: every forwarded connection is reset, and new ones are closed as soon as they
  // are accepted (the peer sees its calls fail), until Heal().
  void Cut();
  void Heal();
  // A slow peer: each connection accepted from now on forwards nothing, either way, for `d`
  // after it was made (its handshake, TLS or HTTP/2, waits that long).
  void DelayNewConnections(absl::Duration d) { delay_ms_ = absl::ToInt64Milliseconds(d); }
  // Connections forwarded so far.
  int forwarded() const { return forwarded_.load(); }

 private:
  TcpProxy() = default;
  void AcceptLoop();
  void Pump(int client, int upstream);

  std::string upstream_host_;
  int upstream_port_ = 0;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> cut_{false};
  std::atomic<int> forwarded_{0};
  std::atomic<int64_t> delay_ms_{0};
  std::thread acceptor_;

  absl::Mutex mu_;
  std::vector<int> open_ ABSL_GUARDED_BY(mu_);  // Sockets of forwarded connections.
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::testing

#endif  // PSCLUSTER_TESTS_CLUSTER_TCP_PROXY_H_
