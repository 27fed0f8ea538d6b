#include "server/ps_service.h"

#include "common/status_convert.h"

namespace pscluster {
namespace {

class PullReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  PullReactor(PsHandler* handler, Executor* executor, std::shared_ptr<BufferPool> pool,
              const DataPlaneOptions& options, const grpc::ByteBuffer& request) {
    stream_ = DataStream::Create(
        DataStream::Mode::kPull, handler, executor, std::move(pool), options,
        {nullptr, [this](const grpc::ByteBuffer* b) { StartWrite(b); },
         [this](grpc::Status s) { Finish(std::move(s)); }});
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
              const DataPlaneOptions& options, grpc::ByteBuffer* response) {
    stream_ = DataStream::Create(DataStream::Mode::kPush, handler, executor, std::move(pool),
                                 options,
                                 {[this](grpc::ByteBuffer* b) { StartRead(b); }, nullptr,
                                  [this](grpc::Status s) { Finish(std::move(s)); }});
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
                  const DataPlaneOptions& options) {
    stream_ = DataStream::Create(DataStream::Mode::kPushPull, handler, executor, std::move(pool),
                                 options,
                                 {[this](grpc::ByteBuffer* b) { StartRead(b); },
                                  [this](const grpc::ByteBuffer* b) { StartWrite(b); },
                                  [this](grpc::Status s) { Finish(std::move(s)); }});
    stream_->StartReading(nullptr);
  }
  void OnReadDone(bool ok) override { stream_->OnReadDone(ok); }
  void OnWriteDone(bool ok) override { stream_->OnWriteDone(ok); }
  void OnCancel() override { stream_->OnCancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<DataStream> stream_;
};

}  // namespace

PsService::PsService(PsHandler* handler, Executor* data_executor, Executor* control_executor,
                     DataPlaneOptions options, Executor* replica_executor)
    : handler_(handler),
      data_(data_executor),
      control_(control_executor),
      replica_(replica_executor != nullptr ? replica_executor : control_executor),
      options_(options),
      pool_(BufferPool::Create()) {}

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* PsService::Unary(grpc::CallbackServerContext* ctx, const Req* req,
                                           Resp* resp,
                                           absl::Status (PsHandler::*fn)(const Req&, Resp*),
                                           Executor* on) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  (on != nullptr ? on : control_)->Post([this, reactor, req, resp, fn] {
    reactor->Finish(ToGrpcStatus((handler_->*fn)(*req, resp)));
  });
  return reactor;
}

grpc::ServerUnaryReactor* PsService::CreateTables(grpc::CallbackServerContext* ctx,
                                                  const v1::CreateTablesRequest* req,
                                                  v1::CreateTablesResponse* resp) {
  return Unary(ctx, req, resp, &PsHandler::CreateTables);
}
grpc::ServerUnaryReactor* PsService::UpdateShardMap(grpc::CallbackServerContext* ctx,
                                                    const v1::UpdateShardMapRequest* req,
                                                    v1::UpdateShardMapResponse* resp) {
  return Unary(ctx, req, resp, &PsHandler::UpdateShardMap);
}
grpc::ServerUnaryReactor* PsService::Checkpoint(grpc::CallbackServerContext* ctx,
                                                const v1::CheckpointRequest* req,
                                                v1::CheckpointResponse* resp) {
  return Unary(ctx, req, resp, &PsHandler::Checkpoint);
}
grpc::ServerUnaryReactor* PsService::Restore(grpc::CallbackServerContext* ctx,
                                             const v1::RestoreRequest* req,
                                             v1::RestoreResponse* resp) {
  return Unary(ctx, req, resp, &PsHandler::Restore);
}
grpc::ServerUnaryReactor* PsService::Export(grpc::CallbackServerContext* ctx,
                                            const v1::ExportRequest* req,
                                            v1::ExportResponse* resp) {
  return Unary(ctx, req, resp, &PsHandler::Export);
}
grpc::ServerUnaryReactor* PsService::DropJob(grpc::CallbackServerContext* ctx,
                                             const v1::DropJobRequest* req,
                                             v1::DropJobResponse* resp) {
  return Unary(ctx, req, resp, &PsHandler::DropJob);
}
grpc::ServerUnaryReactor* PsService::Status(grpc::CallbackServerContext* ctx,
                                            const v1::ServerStatusRequest* req,
                                            v1::ServerStatus* resp) {
  return Unary(ctx, req, resp, &PsHandler::Status);
}

grpc::ServerUnaryReactor* PsService::FenceWorker(grpc::CallbackServerContext* ctx,
                                                 const v1::FenceWorkerRequest* req,
                                                 v1::FenceWorkerResponse* resp) {
  return Unary(ctx, req, resp, &PsHandler::FenceWorker);
}

grpc::ServerUnaryReactor* PsService::Replicate(grpc::CallbackServerContext* ctx,
                                               const v1::ReplicateRequest* req,
                                               v1::ReplicateResponse* resp) {
  // On threads of their own, never data threads: two servers backing each other up wait for
  // their copies from their data threads, and each one's copies must still get applied.
  return Unary(ctx, req, resp, &PsHandler::Replicate, replica_);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* PsService::Pull(grpc::CallbackServerContext*,
                                                            const grpc::ByteBuffer* request) {
  return new PullReactor(handler_, data_, pool_, options_, *request);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* PsService::Push(grpc::CallbackServerContext*,
                                                           grpc::ByteBuffer* response) {
  return new PushReactor(handler_, data_, pool_, options_, response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PsService::PushPull(
    grpc::CallbackServerContext*) {
  return new PushPullReactor(handler_, data_, pool_, options_);
}

}  // namespace pscluster
