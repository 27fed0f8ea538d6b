// The scheduler's passes: each one step of a loop, an object in a file of its own that sees
// only the SchedulerCore (scheduler_core.h). A pass reads and changes the job table under the
// core's lock and makes its calls to other daemons outside it; it keeps no state of its own
// that another pass needs.
//
// The Scheduler (scheduler.h) makes them with the factories below and runs them in this order
// (DefinePasses, scheduler_loop.cc), timing each run into pscluster_scheduler_pass_seconds:
//   control loop: leases, verify_tasks, hand_over, drop_unreachable_backups, replace_backups,
//                 recover, place, rejoin, balance_data, cleanups, persist_progress;
//   poll thread:  poll_servers;
//   moves thread: moves (which runs the elastic pass's step between the rebalancer's look and
//                 the queued moves).
// The order matters: lost nodes are found before their ranks are handed over and their jobs
// recovered; recoveries queue jobs that placement then places; nodes that a cleanup frees are
// seen by the next pass's placement.
//
// A test can make any pass over a core of its own (a real store, a FakeClock, a
// FakeClusterRpc) and run it alone, with no Scheduler.
#ifndef PSCLUSTER_SCHEDULER_PASSES_H_
#define PSCLUSTER_SCHEDULER_PASSES_H_

#include <memory>

#include "scheduler/scheduler_core.h"

namespace pscluster::scheduler {

class Pass {
 public:
  virtual ~Pass() = default;
  // The pass's name in logs and in the pass_seconds metric's `pass` label.
  virtual const char* name() const = 0;
  // One run. REQUIRES: not called concurrently with itself.
  virtual void Run() = 0;
};

// Each factory: REQUIRES core outlives the pass.

// Control loop.
// Nodes whose lease expired: their jobs recover, their ranks are handed over (lease_pass.cc).
std::unique_ptr<Pass> MakeLeasePass(SchedulerCore& core);
// Once after a restart (past the start-up grace): asks the workers of running jobs whether
// they still run their tasks; a rank whose worker does not is lost (verify_tasks_pass.cc).
std::unique_ptr<Pass> MakeVerifyTasksPass(SchedulerCore& core);
// A lost worker's rank goes to an idle live worker at the slowest of its clocks on the
// servers, or leaves the job (another rank reads its data), or the job rolls back when neither
// can be done (handover_pass.cc).
std::unique_ptr<Pass> MakeHandOverPass(SchedulerCore& core);
// Backups that their primary cannot reach leave the job's map, so that the primary's pushes go
// through again with fewer copies (drop_backups_pass.cc).
std::unique_ptr<Pass> MakeDropUnreachableBackupsPass(SchedulerCore& core);
// Shards that lost a backup that way get a new one, live, on another live server of the job's
// map that their primary has not been cut from (replace_backups_pass.cc).
std::unique_ptr<Pass> MakeReplaceBackupsPass(SchedulerCore& core);
// RECOVERING jobs: their tasks stop, then their lost server's backups are promoted, or the job
// is dropped, rolled back to its newest complete checkpoint and queued (recovery_pass.cc).
std::unique_ptr<Pass> MakeRecoveryPass(SchedulerCore& core);
// Queued jobs that are due get servers and workers; the map goes to the servers, the tasks to
// the workers; a failure rolls back and retries later (placement_pass.cc).
std::unique_ptr<Pass> MakePlacementPass(SchedulerCore& core);
// Ranks that left running jobs come back on idle workers (while no job is queued) (rejoin_pass.cc).
std::unique_ptr<Pass> MakeRejoinPass(SchedulerCore& core);
// New data shares for running jobs with balance_data whose ranks are out of balance
// (data_balance_pass.cc).
std::unique_ptr<Pass> MakeDataBalancePass(SchedulerCore& core);
// The queued StopTask and DropJob calls that free an ended job's nodes (cleanup_pass.cc).
std::unique_ptr<Pass> MakeCleanupPass(SchedulerCore& core);
// Progress reported since a job was last written, at most every progress_persist_interval
// (progress_pass.cc).
std::unique_ptr<Pass> MakeProgressPass(SchedulerCore& core);

// Poll thread: the servers of running jobs say who a waiting step waits for, which backups
// they cannot reach and how much memory the job holds (poll_pass.cc).
std::unique_ptr<Pass> MakePollPass(SchedulerCore& core);

// Moves thread: the rebalancer's look when due, the elastic pass's step, then the queued live
// shard moves, one at a time (moves_pass.cc).
std::unique_ptr<Pass> MakeMovesPass(SchedulerCore& core);
// The next step of every running job's active change of servers (scale, drain): queues its next
// move, takes a server that holds nothing any more out of its map, or concludes it; marks
// DRAINING servers no job uses any more DRAINED (elastic_pass.cc; run by the moves pass).
std::unique_ptr<Pass> MakeElasticPass(SchedulerCore& core);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_PASSES_H_
