#include "scheduler/etcd_client.h"

#include <fstream>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/channel.h"

namespace pscluster::scheduler {

namespace {

// The TLS files for etcd, each readable; errors name the etcd flag, not the daemon's own TLS
// flags that MakeChannel's would name.
absl::Status CheckEtcdTls(const TlsFiles& tls) {
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError(
        "--etcd_cert_file and --etcd_key_file must be given together (a client certificate "
        "for etcd's --client-cert-auth)");
  }
  if (!tls.enabled()) return absl::OkStatus();
  for (const auto& [flag, path] : {std::pair<const char*, const std::string*>{"etcd_ca_file", &tls.ca},
                                   {"etcd_cert_file", &tls.cert},
                                   {"etcd_key_file", &tls.key}}) {
    if (path->empty()) continue;
    std::ifstream in(*path);
    if (!in.good()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": cannot read '", *path, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const std::string& endpoints,
                                                                absl::Duration timeout,
                                                                const TlsFiles& tls) {
  if (endpoints.empty()) {
    return absl::InvalidArgumentError("--etcd_endpoints: empty (host:port[,host:port...])");
  }
  absl::Status tls_ok = CheckEtcdTls(tls);
  if (!tls_ok.ok()) return tls_ok;
  ChannelOptions options;
  options.tls = tls;
  auto channel = MakeChannel(endpoints, options);
  if (!channel.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd_endpoints: ", channel.status().message()));
  }
  std::unique_ptr<EtcdClient> c(new EtcdClient());
  c->endpoints_ = endpoints;
  c->timeout_ = timeout;
  c->kv_ = etcdserverpb::KV::NewStub(*channel);
  c->lease_ = etcdserverpb::Lease::NewStub(*channel);
  return c;
}

absl::Status EtcdClient::Error(const char* call, const std::string& what,
                               const grpc::Status& s) const {
  std::string msg = absl::StrCat("etcd at ", endpoints_, ": ", call, " ", what, ": ",
                                 s.error_message());
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::DeadlineExceededError(msg);
  }
  // Whatever etcd refuses (no leader, too many requests, a request too large, a compacted
  // revision) is a fault of the store as far as the scheduler is concerned.
  return absl::UnavailableError(msg);
}

std::unique_ptr<grpc::ClientContext> EtcdClient::Begin(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  if (closed_) return nullptr;
  auto ctx = CallContext(timeout);
  live_.insert(ctx.get());
  return ctx;
}

void EtcdClient::Release(grpc::ClientContext* ctx) {
  absl::MutexLock l(&mu_);
  live_.erase(ctx);
}

absl::Status EtcdClient::Closed(const char* call) const {
  return absl::UnavailableError(
      absl::StrCat("etcd at ", endpoints_, ": ", call, ": this client was closed"));
}

void EtcdClient::Close() {
  absl::MutexLock l(&mu_);
  closed_ = true;
  for (grpc::ClientContext* ctx : live_) ctx->TryCancel();
}

namespace {
// Releases a tracked context when the call is over.
class Tracked {
 public:
  Tracked(std::unique_ptr<grpc::ClientContext> ctx, std::function<void(grpc::ClientContext*)> done)
      : ctx_(std::move(ctx)), done_(std::move(done)) {}
  ~Tracked() {
    if (ctx_) done_(ctx_.get());
  }
  grpc::ClientContext* get() const { return ctx_.get(); }
  explicit operator bool() const { return ctx_ != nullptr; }

 private:
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::function<void(grpc::ClientContext*)> done_;
};
}  // namespace

#define PS_ETCD_CONTEXT(ctx, timeout, call)                                  \
  Tracked ctx(Begin(timeout), [this](grpc::ClientContext* c) { Release(c); }); \
  if (!ctx) return Closed(call)

absl::StatusOr<etcdserverpb::RangeResponse> EtcdClient::Range(
    const etcdserverpb::RangeRequest& request) {
  PS_ETCD_CONTEXT(ctx, timeout_, "Range");
  etcdserverpb::RangeResponse resp;
  grpc::Status s = kv_->Range(ctx.get(), request, &resp);
  if (!s.ok()) return Error("Range", request.key(), s);
  return resp;
}

absl::StatusOr<etcdserverpb::KeyValue> EtcdClient::Get(const std::string& key) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  auto resp = Range(req);
  if (!resp.ok()) return resp.status();
  if (resp->kvs_size() == 0) return absl::NotFoundError(absl::StrCat("etcd: no key ", key));
  return resp->kvs(0);
}

absl::StatusOr<etcdserverpb::RangeResponse> EtcdClient::GetPrefix(
    const std::string& prefix, etcdserverpb::RangeRequest::SortTarget order) {
  etcdserverpb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  req.set_sort_target(order);
  req.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
  return Range(req);
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(const etcdserverpb::TxnRequest& request) {
  PS_ETCD_CONTEXT(ctx, timeout_, "Txn");
  etcdserverpb::TxnResponse resp;
  grpc::Status s = kv_->Txn(ctx.get(), request, &resp);
  if (!s.ok()) {
    const std::string& key =
        request.compare_size() > 0 ? request.compare(0).key() : std::string("(no compare)");
    return Error("Txn", key, s);
  }
  return resp;
}

absl::Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  PS_ETCD_CONTEXT(ctx, timeout_, "Put");
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  etcdserverpb::PutResponse resp;
  grpc::Status s = kv_->Put(ctx.get(), req, &resp);
  if (!s.ok()) return Error("Put", key, s);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> EtcdClient::LeaseGrant(int64_t ttl_seconds) {
  PS_ETCD_CONTEXT(ctx, timeout_, "LeaseGrant");
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_seconds);
  etcdserverpb::LeaseGrantResponse resp;
  grpc::Status s = lease_->LeaseGrant(ctx.get(), req, &resp);
  if (!s.ok()) return Error("LeaseGrant", absl::StrCat(ttl_seconds, " s"), s);
  if (!resp.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("etcd at ", endpoints_, ": LeaseGrant: ", resp.error()));
  }
  return resp.id();
}

absl::StatusOr<int64_t> EtcdClient::LeaseKeepAlive(int64_t lease, absl::Duration timeout) {
  PS_ETCD_CONTEXT(ctx, timeout, "LeaseKeepAlive");
  auto stream = lease_->LeaseKeepAlive(ctx.get());
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse resp;
  const bool ok = stream->Write(req) && stream->Read(&resp);
  stream->WritesDone();
  if (!ok) {
    ctx.get()->TryCancel();
    grpc::Status s = stream->Finish();
    if (s.ok()) s = grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream ended without an answer");
    return Error("LeaseKeepAlive", absl::StrCat("lease ", lease), s);
  }
  ctx.get()->TryCancel();
  stream->Finish();
  return resp.ttl();
}

absl::Status EtcdClient::LeaseRevoke(int64_t lease) {
  PS_ETCD_CONTEXT(ctx, timeout_, "LeaseRevoke");
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseRevokeResponse resp;
  grpc::Status s = lease_->LeaseRevoke(ctx.get(), req, &resp);
  if (!s.ok()) return Error("LeaseRevoke", absl::StrCat("lease ", lease), s);
  return absl::OkStatus();
}

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // Every key.
}

#undef PS_ETCD_CONTEXT

}  // namespace pscluster::scheduler
