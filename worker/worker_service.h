// gRPC adapter of WorkerControl: requests parsed and their enums checked at the edge
// (ParsedUnaryService), then WorkerNode called and its status converted. No logic lives here.
#ifndef PSCLUSTER_WORKER_WORKER_SERVICE_H_
#define PSCLUSTER_WORKER_WORKER_SERVICE_H_

#include "common/parsed_unary.h"
#include "proto/worker.grpc.pb.h"
#include "worker/worker_node.h"

namespace pscluster::worker {

class WorkerService final : public ParsedUnaryService<v1::WorkerControl::Service> {
 public:
  // REQUIRES: `node` and `authz` outlive the service. `authz` nullptr: no checks.
  explicit WorkerService(WorkerNode* node, const Authorizer* authz = nullptr);

 private:
  WorkerNode* const node_;
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_WORKER_SERVICE_H_
