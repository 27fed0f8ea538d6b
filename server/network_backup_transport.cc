#include "server/network_backup_transport.h"

#include <atomic>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/channel.h"
#include "common/data_auth.h"
#include "common/status_convert.h"
#include "proto/ps.grpc.pb.h"
#include "server/buffer_pool.h"
#include "server/client/dialer.h"
#include "server/client/round.h"
#include "server/client/tcp_conn.h"
#include "server/tcp_frame.h"
#include "server/wire.h"

namespace pscluster {
namespace {

// Copies to the backups of this server's shards: over each backup's TCP data port (one
// connection per backup, kept, and per job when the job has a data secret, which the
// connection proves as a server, common/data_auth.h kReplicaWorker; each chunk a round of its
// own, as a worker's push with `replica_of`, its payload sent from the received frame without a
// copy, in TLS when this server runs with TLS: its certificate is its client certificate) when
// it offers one and this server sends no credential or the job has a
// secret; else, and for snapshot parts and clocks (ReplicateRequest.clocks), as Replicate
// calls (one channel per backup, kept), which carry this server's credential.
class NetworkBackupTransport final : public BackupTransport {
 public:
  using SecretOf = std::function<std::string(const std::string& job_id)>;
  NetworkBackupTransport(TlsFiles tls, std::string credential, SecretOf secret_of)
      : pool_(BufferPool::Create(64 << 20)), secret_of_(std::move(secret_of)) {
    options_.tls = std::move(tls);
    options_.bearer_token = std::move(credential);
    // The data plane's HTTP/2 windows: a chunk of a few hundred KiB in one go.
    options_.int_args = *DataPlaneChannelArgs();
  }

  absl::Status Send(const std::string& address, const v1::ReplicateRequest& req,
                    const Payload& values) override {
    const bool seed = !req.seed().empty() || req.seed_size() != 0 || req.has_clocks();
    if (!seed) {
      auto conn = DataConnTo(address, req.chunk().tag().job_id());
      if (conn.ok() && *conn != nullptr) return ForwardOverTcp(**conn, address, req, values);
      if (!conn.ok()) return conn.status();
    }
    v1::ParameterServer::Stub* stub = Stub(address);
    if (stub == nullptr) return absl::UnavailableError(absl::StrCat("no channel to ", address));
    auto ctx = CallContext(kTimeout, options_);
    v1::ReplicateResponse resp;
    grpc::Status st;
    if (values.empty()) {
      st = stub->Replicate(ctx.get(), req, &resp);
    } else {
      v1::ReplicateRequest with_values = req;
      with_values.mutable_chunk()->set_values(values.ToString());
      st = stub->Replicate(ctx.get(), with_values, &resp);
    }
    return FromGrpcStatus(st, absl::StrCat("Replicate to ", address));
  }

 private:
  static constexpr absl::Duration kTimeout = absl::Seconds(10);

  v1::ParameterServer::Stub* Stub(const std::string& address) {
    absl::MutexLock l(&mu_);
    auto& slot = stubs_[address];
    if (slot == nullptr) {
      auto channel = MakeChannel(address, options_);
      if (!channel.ok()) return nullptr;
      slot = v1::ParameterServer::NewStub(*channel);
    }
    return slot.get();
  }

  // The data connection to the backup at `address` (dialer.h: its TCP data port); nullptr when
  // there is none to use (it offers none, or this server sends a credential without a secret).
  absl::StatusOr<std::shared_ptr<TcpConn>> DataConnTo(const std::string& address,
                                                      const std::string& job_id) {
    const std::string secret = secret_of_(job_id);
    const std::string key = secret.empty() ? address : absl::StrCat(address, "\n", job_id);
    {
      absl::MutexLock l(&mu_);
      auto it = conns_.find(key);
      if (it != conns_.end() && (it->second == nullptr || !it->second->done())) return it->second;
    }
    v1::ParameterServer::Stub* stub = Stub(address);
    if (stub == nullptr) return absl::UnavailableError(absl::StrCat("no channel to ", address));
    DialOptions d;
    d.transport = DataTransport::kTcp;
    d.timeout = kTimeout;
    d.channel = options_;
    d.pool = pool_;
    d.spin = absl::Microseconds(50);
    if (!secret.empty()) d.auth = DataAuth{job_id, kReplicaWorker, 0, secret};
    absl::StatusOr<Dialed> dialed = DialDataConn(stub, address, d);
    if (!dialed.ok()) return dialed.status();
    std::shared_ptr<TcpConn> conn = std::move(dialed->conn);
    absl::MutexLock l(&mu_);
    conns_[key] = conn;
    return conn;
  }

  absl::Status ForwardOverTcp(TcpConn& conn, const std::string& address,
                              const v1::ReplicateRequest& req, const Payload& values) {
    v1::PushChunk c = req.chunk();
    c.set_replica_of(req.primary());
    c.set_last(true);
    c.set_request_id(next_request_.fetch_add(1));
    auto round = std::make_shared<Round>(c.request_id(), std::vector<ReplyDest>(1));
    std::vector<grpc::ByteBuffer> frames;
    frames.push_back(EncodeWithPayload(c, kPushChunkValuesField, PayloadSlices(values)));
    absl::Status s = conn.Send(round, std::move(frames));
    if (s.ok()) s = conn.Wait(round, absl::Now() + kTimeout);
    if (!s.ok()) {
      conn.Forget(c.request_id());
      return absl::Status(s.code(), absl::StrCat("copy to ", address, ": ", s.message()));
    }
    return absl::OkStatus();
  }

  ChannelOptions options_;
  const std::shared_ptr<BufferPool> pool_;
  const SecretOf secret_of_;
  std::atomic<uint64_t> next_request_{1};
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<v1::ParameterServer::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<TcpConn>> conns_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<BackupTransport> NewNetworkBackupTransport(
    TlsFiles tls, std::string credential,
    std::function<std::string(const std::string& job_id)> secret_of) {
  return std::make_shared<NetworkBackupTransport>(std::move(tls), std::move(credential),
                                                  std::move(secret_of));
}

}  // namespace pscluster
