// gRPC edge of the parameter server: thin adapters from pscluster.v1.ParameterServer to
// PsHandler. Control-plane calls run on a small control executor (they may touch the disk or
// allocate tables); data-plane calls are raw-bytes streams served by DataStream so payloads are
// never copied into protobuf strings.
#ifndef PSCLUSTER_SERVER_PS_SERVICE_H_
#define PSCLUSTER_SERVER_PS_SERVICE_H_

#include <memory>

#include "proto/ps.grpc.pb.h"
#include "server/buffer_pool.h"
#include "server/data_stream.h"
#include "server/executor.h"
#include "server/ps_handler.h"

namespace pscluster {

namespace internal {
using PsServiceBase = v1::ParameterServer::WithCallbackMethod_CreateTables<
    v1::ParameterServer::WithCallbackMethod_UpdateShardMap<
        v1::ParameterServer::WithRawCallbackMethod_Pull<
            v1::ParameterServer::WithRawCallbackMethod_Push<
                v1::ParameterServer::WithRawCallbackMethod_PushPull<
                    v1::ParameterServer::WithCallbackMethod_Checkpoint<
                        v1::ParameterServer::WithCallbackMethod_Restore<
                            v1::ParameterServer::WithCallbackMethod_Export<
                                v1::ParameterServer::WithCallbackMethod_DropJob<
                                    v1::ParameterServer::WithCallbackMethod_Status<
                                        v1::ParameterServer::WithCallbackMethod_FenceWorker<
                                            v1::ParameterServer::WithCallbackMethod_Replicate<
                                                v1::ParameterServer::Service>>>>>>>>>>>>;
}  // namespace internal

class PsService final : public internal::PsServiceBase {
 public:
  // REQUIRES: handler and executors outlive the service (and the gRPC server using it).
  // `replica_executor` applies Replicate calls (default: the control executor); it must never
  // run anything that waits for another server.
  PsService(PsHandler* handler, Executor* data_executor, Executor* control_executor,
            DataPlaneOptions options = {}, Executor* replica_executor = nullptr);

  grpc::ServerUnaryReactor* CreateTables(grpc::CallbackServerContext* ctx,
                                         const v1::CreateTablesRequest* req,
                                         v1::CreateTablesResponse* resp) override;
  grpc::ServerUnaryReactor* UpdateShardMap(grpc::CallbackServerContext* ctx,
                                           const v1::UpdateShardMapRequest* req,
                                           v1::UpdateShardMapResponse* resp) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const v1::CheckpointRequest* req,
                                       v1::CheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* Restore(grpc::CallbackServerContext* ctx,
                                    const v1::RestoreRequest* req,
                                    v1::RestoreResponse* resp) override;
  grpc::ServerUnaryReactor* Export(grpc::CallbackServerContext* ctx, const v1::ExportRequest* req,
                                   v1::ExportResponse* resp) override;
  grpc::ServerUnaryReactor* DropJob(grpc::CallbackServerContext* ctx,
                                    const v1::DropJobRequest* req,
                                    v1::DropJobResponse* resp) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const v1::ServerStatusRequest* req,
                                   v1::ServerStatus* resp) override;
  grpc::ServerUnaryReactor* FenceWorker(grpc::CallbackServerContext* ctx,
                                        const v1::FenceWorkerRequest* req,
                                        v1::FenceWorkerResponse* resp) override;
  grpc::ServerUnaryReactor* Replicate(grpc::CallbackServerContext* ctx,
                                      const v1::ReplicateRequest* req,
                                      v1::ReplicateResponse* resp) override;

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Pull(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* request) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* Push(grpc::CallbackServerContext* ctx,
                                                  grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PushPull(
      grpc::CallbackServerContext* ctx) override;

 private:
  template <typename Req, typename Resp>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const Req* req, Resp* resp,
                                  absl::Status (PsHandler::*fn)(const Req&, Resp*),
                                  Executor* on = nullptr);

  PsHandler* const handler_;
  Executor* const data_;
  Executor* const control_;
  Executor* const replica_;
  const DataPlaneOptions options_;
  const std::shared_ptr<BufferPool> pool_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_PS_SERVICE_H_
