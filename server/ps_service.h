// gRPC edge of the parameter server: thin adapters from pscluster.v1.ParameterServer to
// PsHandler. Control-plane calls are parsed and their enums checked at the edge
// (ParsedUnaryService), then run on a small control executor (they may touch the disk or
// allocate tables); data-plane calls are raw-bytes streams served by DataStream so payloads are
// never copied into protobuf strings.
#ifndef PSCLUSTER_SERVER_PS_SERVICE_H_
#define PSCLUSTER_SERVER_PS_SERVICE_H_

#include <memory>

#include "common/executor.h"
#include "common/parsed_unary.h"
#include "proto/ps.grpc.pb.h"
#include "server/buffer_pool.h"
#include "server/data_stream.h"
#include "server/ps_handler.h"

namespace pscluster {

namespace internal {
using PsServiceBase = ParsedUnaryService<v1::ParameterServer::WithRawCallbackMethod_Pull<
    v1::ParameterServer::WithRawCallbackMethod_Push<
        v1::ParameterServer::WithRawCallbackMethod_PushPull<v1::ParameterServer::Service>>>>;
}  // namespace internal

class PsService final : public internal::PsServiceBase {
 public:
  // REQUIRES: handler and executors outlive the service (and the gRPC server using it).
  // `replica_executor` applies Replicate calls (default: the control executor); it must never
  // run anything that waits for another server. `authz` (outliving the service) checks every
  // call, the data-plane streams included, before it starts; nullptr = no checks.
  PsService(PsHandler* handler, Executor* data_executor, Executor* control_executor,
            DataPlaneOptions options = {}, Executor* replica_executor = nullptr,
            const Authorizer* authz = nullptr);

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Pull(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* request) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* Push(grpc::CallbackServerContext* ctx,
                                                  grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PushPull(
      grpc::CallbackServerContext* ctx) override;

 private:
  // Serves unary method `method` by running `fn` on `on`.
  template <typename Req, typename Resp>
  void Unary(absl::string_view method, absl::Status (PsHandler::*fn)(const Req&, Resp*),
             Executor* on);

  PsHandler* const handler_;
  Executor* const data_;
  Executor* const control_;
  Executor* const replica_;
  const DataPlaneOptions options_;
  const std::shared_ptr<BufferPool> pool_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_PS_SERVICE_H_
