// A client of an etcd 3.4 cluster over its gRPC API (proto/etcd/etcd.proto): reads, conditional
// transactions and leases, each call with a deadline. The endpoints are one channel
// (common/channel.h): calls go round-robin to the members that answer, so a lost member is
// skipped. Errors are UNAVAILABLE (or DEADLINE_EXCEEDED) and name the endpoints and the call.
//
// Thread-safe.
#ifndef PSCLUSTER_SCHEDULER_ETCD_CLIENT_H_
#define PSCLUSTER_SCHEDULER_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "proto/etcd/etcd.grpc.pb.h"

namespace pscluster::scheduler {

class EtcdClient {
 public:
  // `endpoints`: "host:port[,host:port...]" of the etcd members' client URLs: plain gRPC, or
  // TLS when `tls` names files (etcd's --trusted-ca-file signs `tls.cert` for its
  // --client-cert-auth; `tls.ca` verifies the members' certificates, which must name the
  // endpoints' host). Errors name the flag at fault (--etcd_endpoints, --etcd_ca_file,
  // --etcd_cert_file, --etcd_key_file).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(const std::string& endpoints,
                                                             absl::Duration timeout,
                                                             const TlsFiles& tls = {});

  const std::string& endpoints() const { return endpoints_; }
  absl::Duration timeout() const { return timeout_; }

  absl::StatusOr<etcdserverpb::RangeResponse> Range(const etcdserverpb::RangeRequest& request);
  // The key's current value and revisions; NOT_FOUND when it does not exist.
  absl::StatusOr<etcdserverpb::KeyValue> Get(const std::string& key);
  // Every key starting with `prefix`, ordered by `order` (ascending).
  absl::StatusOr<etcdserverpb::RangeResponse> GetPrefix(
      const std::string& prefix,
      etcdserverpb::RangeRequest::SortTarget order = etcdserverpb::RangeRequest::KEY);
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request);
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease = 0);

  // A lease of `ttl_seconds`; its id.
  absl::StatusOr<int64_t> LeaseGrant(int64_t ttl_seconds);
  // Renews the lease once; the seconds it has left (<= 0: it had already expired).
  absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease, absl::Duration timeout);
  absl::Status LeaseRevoke(int64_t lease);

  // Cancels the calls in flight and fails every later one (UNAVAILABLE): a deposed leader's
  // store stops at once instead of waiting out its calls' deadlines.
  void Close();

  // The end of the range of every key with `prefix` (etcd's range_end convention).
  static std::string PrefixEnd(const std::string& prefix);

 private:
  EtcdClient() = default;
  absl::Status Error(const char* call, const std::string& what, const grpc::Status& s) const;
  // A context with `timeout`, tracked until Release() (nullptr once closed).
  std::unique_ptr<grpc::ClientContext> Begin(absl::Duration timeout);
  void Release(grpc::ClientContext* ctx);
  absl::Status Closed(const char* call) const;

  std::string endpoints_;
  absl::Duration timeout_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<grpc::ClientContext*> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_ETCD_CLIENT_H_
