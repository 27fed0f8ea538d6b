#include "server/ps_service.h"

#include "common/data_auth.h"
#include "common/status_convert.h"

namespace pscluster {
namespace {

class PullReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  PullReactor(PsHandler* handler, Executor* executor, std::shared_ptr<BufferPool> pool,
              const DataPlaneOptions& options, DataStream::CallAuth auth,
              const grpc::ByteBuffer& request) {
    stream_ = DataStream::Create(
        DataStream::Mode::kPull, handler, executor, std::move(pool), options,
        {nullptr, [this](const grpc::ByteBuffer* b) { StartWrite(b); },
         [this](grpc::Status s) { Finish(std::move(s)); }});
    stream_->SetCallAuth(std::move(auth));
    stream_->StartPull(request);
  }
  void OnWriteDone(bool ok) override { stream_->OnWriteDone(ok); }
  void OnCancel() override { stream_->OnCancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<DataStream> stream_;
};

class PushReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  PushReactor(PsHandler* handler, Executor* executor, std::shared_ptr<BufferPool> pool,
              const DataPlaneOptions& options, DataStream::CallAuth auth,
              grpc::ByteBuffer* response) {
    stream_ = DataStream::Create(DataStream::Mode::kPush, handler, executor, std::move(pool),
                                 options,
                                 {[this](grpc::ByteBuffer* b) { StartRead(b); }, nullptr,
                                  [this](grpc::Status s) { Finish(std::move(s)); }});
    stream_->SetCallAuth(std::move(auth));
    stream_->StartReading(response);
  }
  void OnReadDone(bool ok) override { stream_->OnReadDone(ok); }
  void OnCancel() override { stream_->OnCancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<DataStream> stream_;
};

class PushPullReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PushPullReactor(PsHandler* handler, Executor* executor, std::shared_ptr<BufferPool> pool,
                  const DataPlaneOptions& options, DataStream::CallAuth auth) {
    stream_ = DataStream::Create(DataStream::Mode::kPushPull, handler, executor, std::move(pool),
                                 options,
                                 {[this](grpc::ByteBuffer* b) { StartRead(b); },
                                  [this](const grpc::ByteBuffer* b) { StartWrite(b); },
                                  [this](grpc::Status s) { Finish(std::move(s)); }});
    stream_->SetCallAuth(std::move(auth));
    stream_->StartReading(nullptr);
  }
  void OnReadDone(bool ok) override { stream_->OnReadDone(ok); }
  void OnWriteDone(bool ok) override { stream_->OnWriteDone(ok); }
  void OnCancel() override { stream_->OnCancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<DataStream> stream_;
};

// A data-plane stream refused before it starts: finished at once with `status`.
template <typename Reactor>
class RefusedReactor final : public Reactor {
 public:
  explicit RefusedReactor(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// The call's proof of its job's data secret, if it sent one (DataStream::CallAuth).
DataStream::CallAuth CallAuthOf(const grpc::CallbackServerContext* ctx) {
  DataStream::CallAuth a;
  a.peer = ctx->peer();
  const auto& md = ctx->client_metadata();
  auto it = md.find(kGrpcDataAuthKey);
  if (it == md.end()) return a;
  a.present = true;
  auto claim = ParseGrpcDataAuth(absl::string_view(it->second.data(), it->second.size()));
  if (claim.ok()) {
    a.claim = std::move(*claim);
  } else {
    a.malformed = claim.status();
  }
  return a;
}

absl::Status CheckStream(const Authorizer* authz, const grpc::CallbackServerContext* ctx,
                         absl::string_view method) {
  return authz == nullptr ? absl::OkStatus() : authz->Check(*ctx, method);
}

}  // namespace

template <typename Req, typename Resp>
void PsService::Unary(absl::string_view method, absl::Status (PsHandler::*fn)(const Req&, Resp*),
                      Executor* on) {
  Serve<Req, Resp>(method, [this, fn, on](grpc::CallbackServerContext*, const Req& req,
                                          Resp* resp, Done done) {
    on->Post([this, fn, &req, resp, done = std::move(done)] { done((handler_->*fn)(req, resp)); });
  });
}

PsService::PsService(PsHandler* handler, Executor* data_executor, Executor* control_executor,
                     DataPlaneOptions options, Executor* replica_executor,
                     const Authorizer* authz)
    : internal::PsServiceBase("pscluster.v1.ParameterServer"),
      handler_(handler),
      data_(data_executor),
      control_(control_executor),
      replica_(replica_executor != nullptr ? replica_executor : control_executor),
      options_(options),
      pool_(BufferPool::Create()) {
  SetAuthorizer(authz);
  Unary("CreateTables", &PsHandler::CreateTables, control_);
  Unary("UpdateShardMap", &PsHandler::UpdateShardMap, control_);
  Unary("Checkpoint", &PsHandler::Checkpoint, control_);
  Unary("Restore", &PsHandler::Restore, control_);
  Unary("Export", &PsHandler::Export, control_);
  Unary("DropJob", &PsHandler::DropJob, control_);
  Unary("Status", &PsHandler::Status, control_);
  Unary("FenceWorker", &PsHandler::FenceWorker, control_);
  // On threads of their own, never data threads: two servers backing each other up wait for
  // their copies from their data threads, and each one's copies must still get applied.
  Unary("Replicate", &PsHandler::Replicate, replica_);
  // With the call's proof of its job's data secret, as a gRPC pull.
  Serve<v1::ListKeysRequest, v1::ListKeysResponse>(
      "ListKeys", [this](grpc::CallbackServerContext* ctx, const v1::ListKeysRequest& req,
                         v1::ListKeysResponse* resp, Done done) {
        control_->Post([this, &req, resp, proof = CallAuthOf(ctx), done = std::move(done)] {
          done(handler_->ListKeys(req, resp, proof));
        });
      });
  CheckEveryUnaryMethodServed();
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* PsService::Pull(grpc::CallbackServerContext* ctx,
                                                            const grpc::ByteBuffer* request) {
  absl::Status allowed = CheckStream(authorizer(), ctx, "pscluster.v1.ParameterServer.Pull");
  if (!allowed.ok()) return new RefusedReactor<grpc::ServerWriteReactor<grpc::ByteBuffer>>(allowed);
  return new PullReactor(handler_, data_, pool_, options_, CallAuthOf(ctx), *request);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* PsService::Push(grpc::CallbackServerContext* ctx,
                                                           grpc::ByteBuffer* response) {
  absl::Status allowed = CheckStream(authorizer(), ctx, "pscluster.v1.ParameterServer.Push");
  if (!allowed.ok()) return new RefusedReactor<grpc::ServerReadReactor<grpc::ByteBuffer>>(allowed);
  return new PushReactor(handler_, data_, pool_, options_, CallAuthOf(ctx), response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PsService::PushPull(
    grpc::CallbackServerContext* ctx) {
  absl::Status allowed = CheckStream(authorizer(), ctx, "pscluster.v1.ParameterServer.PushPull");
  if (!allowed.ok()) {
    return new RefusedReactor<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>(
        allowed);
  }
  return new PushPullReactor(handler_, data_, pool_, options_, CallAuthOf(ctx));
}

}  // namespace pscluster
