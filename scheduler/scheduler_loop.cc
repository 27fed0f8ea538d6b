// The scheduler's threads and the order of its passes (passes.h; each in a file of its own).
// Every call to another daemon is made by a pass, outside the core's lock.
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/passes.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {
namespace {

// How long the moves thread sleeps when neither a move nor the rebalancer is due.
constexpr absl::Duration kMovesIdleWait = absl::Seconds(1);

}  // namespace

void Scheduler::DefinePasses() {
  // The order matters (passes.h): lost nodes are found before their ranks are handed over and
  // their jobs recovered; recoveries queue jobs that placement then places; nodes that a
  // cleanup frees are seen by the next pass's placement.
  using Factory = std::unique_ptr<Pass> (*)(SchedulerCore&);
  for (Factory make :
       {MakeLeasePass, MakeVerifyTasksPass, MakeHandOverPass, MakeDropUnreachableBackupsPass,
        MakeReplaceBackupsPass, MakeRecoveryPass, MakePlacementPass, MakeRejoinPass,
        MakeDataBalancePass, MakeCleanupPass, MakeProgressPass}) {
    control_passes_.push_back(Timed(make(core_)));
  }
  poll_pass_ = Timed(MakePollPass(core_));
  moves_pass_ = Timed(MakeMovesPass(core_));
}

Scheduler::TimedPass Scheduler::Timed(std::unique_ptr<Pass> pass) {
  TimedPass t;
  t.seconds = core_.metrics().AddHistogram(
      "pscluster_scheduler_pass_seconds",
      "Time each run of a scheduler pass took, calls to other daemons included (the control "
      "loop's passes, the status polls, the moves).",
      absl::StrCat("pass=\"", pass->name(), "\""));
  t.pass = std::move(pass);
  return t;
}

void Scheduler::RunPass(const TimedPass& t) {
  const absl::Time start = absl::Now();  // Real time, even under a test's fake clock.
  t.pass->Run();
  t.seconds->ObserveSeconds(absl::Now() - start);
}

void Scheduler::Start() {
  if (loop_.joinable()) return;
  core_.SetStopping(false);
  loop_ = std::thread([this] { Loop(); });
  poll_loop_ = std::thread([this] { PollLoop(); });
  move_loop_ = std::thread([this] { MoveLoop(); });
}

void Scheduler::Stop() {
  core_.SetStopping(true);
  if (loop_.joinable()) loop_.join();
  if (poll_loop_.joinable()) poll_loop_.join();
  if (move_loop_.joinable()) move_loop_.join();
  // Progress reported since the last write.
  absl::MutexLock l(&core_.mu());
  for (JobRecord& rec : core_.jobs()) {
    if (rec.progress_dirty && !core_.jobs().Persist(rec).ok()) break;  // The store failed: logged.
  }
}

void Scheduler::Loop() {
  while (core_.WaitForWork(core_.options().tick)) ControlPass();
}

void Scheduler::PollLoop() {
  while (core_.WaitUnlessStopping(core_.options().status_poll_interval / 2)) RunPass(poll_pass_);
}

void Scheduler::MoveLoop() {
  while (core_.WaitForMoves(kMovesIdleWait)) RunMoves();
}

void Scheduler::RunOnce() {
  ControlPass();
  RunPass(poll_pass_);
}

void Scheduler::RunMoves() { RunPass(moves_pass_); }

void Scheduler::ControlPass() {
  absl::MutexLock pass(&loop_mu_);
  // A failed write stops the pass where it happened, and every pass after it until the store
  // works again: nothing that was not written is published.
  if (!core_.StoreWorks()) return;
  for (const TimedPass& p : control_passes_) {
    if (!core_.store_status().ok()) return;
    RunPass(p);
  }
}

}  // namespace pscluster::scheduler
