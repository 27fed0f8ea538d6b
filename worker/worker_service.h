// gRPC adapter of WorkerControl: requests parsed and their enums checked at the edge
// (ParsedUnaryService), then WorkerNode called and its status converted. No logic lives here.
// ExportModel's export (a pull of the whole model and a file write) runs on an executor thread of
// its own, never on a gRPC thread; exports run one at a time.
#ifndef PSCLUSTER_WORKER_WORKER_SERVICE_H_
#define PSCLUSTER_WORKER_WORKER_SERVICE_H_

#include "common/executor.h"
#include "common/parsed_unary.h"
#include "proto/worker.grpc.pb.h"
#include "worker/task_logs.h"
#include "worker/worker_node.h"

namespace pscluster::worker {

class WorkerService final : public ParsedUnaryService<v1::WorkerControl::Service> {
 public:
  // REQUIRES: `node`, `authz` and `logs` outlive the service. `authz` nullptr: no checks;
  // `logs` nullptr: GetTaskLogs finds nothing.
  explicit WorkerService(WorkerNode* node, const Authorizer* authz = nullptr,
                         const TaskLogBook* logs = nullptr);

 private:
  WorkerNode* const node_;
  const TaskLogBook* const logs_;
  Executor exports_{1, "export"};  // Last member: joined first, while node_ is still there.
};

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_WORKER_SERVICE_H_
