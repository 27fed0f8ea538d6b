// MoveShard, the handler of a live shard move: checks the request and queues the move
// (SchedulerCore::QueueMove); the moves pass (moves_pass.cc) carries it out on the moves thread.
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {

absl::Status Scheduler::MoveShard(const v1::MoveShardRequest& req, v1::MoveShardResponse* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  if (req.to().empty())
    return absl::InvalidArgumentError("to: the target server's node id is required");
  if (req.reason().size() > 4096)
    return absl::InvalidArgumentError("reason: longer than 4096 bytes");
  absl::MutexLock l(&core_.mu());
  if (!core_.jobs().error().ok()) return core_.jobs().error();
  absl::StatusOr<JobRecord*> found = core_.jobs().FindOrError(req.job_id());
  if (!found.ok()) return found.status();
  JobRecord* rec = *found;
  absl::Status s = core_.QueueMove(*rec, req.shard(), req.from(), req.to(),
                                   req.reason().empty() ? "requested by psctl" : req.reason(),
                                   resp->mutable_move());
  if (s.ok()) {
    Log()->info("job {}: move of shard {}{} from {} to {} queued ({})", req.job_id(), req.shard(),
                resp->move().backup() ? "'s backup" : "", resp->move().from(), req.to(),
                resp->move().reason());
  }
  return s;
}

}  // namespace pscluster::scheduler
