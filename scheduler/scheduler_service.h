// The Scheduler gRPC service: a thin adapter over the Scheduler handler. Requests are parsed
// and their enums checked at the edge (ParsedUnaryService); each method converts the handler's
// absl::Status and finishes the call inline (the handlers only touch memory and short SQLite
// transactions; they never wait on another daemon).
#ifndef PSCLUSTER_SCHEDULER_SCHEDULER_SERVICE_H_
#define PSCLUSTER_SCHEDULER_SCHEDULER_SERVICE_H_

#include "common/parsed_unary.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {

class SchedulerService final : public ParsedUnaryService<v1::Scheduler::Service> {
 public:
  // REQUIRES: `handler` and `authz` outlive the service. `authz` nullptr: no checks.
  explicit SchedulerService(Scheduler* handler, const Authorizer* authz = nullptr);

 private:
  template <typename Req, typename Resp>
  void Inline(absl::string_view method, absl::Status (Scheduler::*fn)(const Req&, Resp*));

  Scheduler* const handler_;
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_SCHEDULER_SERVICE_H_
