// The scheduler's threads and the order of its control pass (ControlPass): each pass lives in a
// file of its own (handover_pass.cc, backup_passes.cc, recovery_pass.cc, placement_pass.cc,
// rejoin_pass.cc, data_balance_pass.cc; the moves thread's in shard_move.cc). Here: the loops,
// leases, the servers' status polls, the calls that free an ended job's nodes, and progress
// persistence. Every call to another daemon is made outside `mu_`.
#include <algorithm>
#include <functional>
#include <set>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/job_state.h"
#include "scheduler/membership.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/progress.h"
#include "scheduler/recovery.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {

namespace {

// A cleanup (StopTask, DropJob) that fails is retried while its node stays live, 1 s after the
// first failure, then twice as long each time up to 30 s; a warning after the third failure. (A
// node that is gone needs none: a server that comes back is told to drop what it should not
// hold when it registers again.)
constexpr int kCleanupWarnAfter = 3;
constexpr absl::Duration kCleanupRetry = absl::Seconds(1);
constexpr absl::Duration kCleanupRetryMax = absl::Seconds(30);

}  // namespace

void Scheduler::Start() {
  {
    absl::MutexLock l(&mu_);
    if (loop_.joinable()) return;
    stopping_ = false;
  }
  loop_ = std::thread([this] { Loop(); });
  poll_loop_ = std::thread([this] { PollLoop(); });
  move_loop_ = std::thread([this] { MoveLoop(); });
}

void Scheduler::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  if (poll_loop_.joinable()) poll_loop_.join();
  if (move_loop_.joinable()) move_loop_.join();
  // Progress reported since the last write.
  absl::MutexLock l(&mu_);
  for (JobRecord& rec : jobs_) {
    if (rec.progress_dirty && !jobs_.Persist(rec).ok()) break;  // The store failed: logged.
  }
}

void Scheduler::Loop() {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wake_ || stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&ready), options_.tick);
      if (stopping_) return;
      wake_ = false;
    }
    ControlPass();
  }
}

void Scheduler::PollLoop() {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), options_.status_poll_interval / 2)) return;
    }
    RunPass(poll_pass_);
  }
}

void Scheduler::RunOnce() {
  ControlPass();
  RunPass(poll_pass_);
}

void Scheduler::DefinePasses() {
  // The order matters: lost nodes are found before their ranks are handed over and their jobs
  // recovered; recoveries queue jobs that placement then places; nodes that a cleanup frees
  // are seen by the next pass's placement.
  control_passes_ = {
      {"leases", &Scheduler::CheckLeases},                 // scheduler_loop.cc
      {"verify_tasks", &Scheduler::VerifyTasksAfterRestart},  // handover_pass.cc
      {"hand_over", &Scheduler::HandOverRanks},            // handover_pass.cc
      {"drop_unreachable_backups", &Scheduler::DropUnreachableBackups},  // backup_passes.cc
      {"replace_backups", &Scheduler::ReplaceBackups},     // backup_passes.cc
      {"recover", &Scheduler::RecoverJobs},                // recovery_pass.cc
      {"place", &Scheduler::PlaceJobs},                    // placement_pass.cc
      {"rejoin", &Scheduler::RejoinRanks},                 // rejoin_pass.cc
      {"balance_data", &Scheduler::BalanceData},           // data_balance_pass.cc
      {"cleanups", &Scheduler::RunCleanups},               // scheduler_loop.cc
      {"persist_progress", &Scheduler::PersistProgress},   // scheduler_loop.cc
  };
  poll_pass_ = {"poll_servers", &Scheduler::PollServers};  // scheduler_loop.cc
  moves_pass_ = {"moves", &Scheduler::CarryOutMoves};      // shard_move.cc, elastic.cc
  auto timed = [this](Pass& p) {
    p.seconds = metrics_.AddHistogram(
        "pscluster_scheduler_pass_seconds",
        "Time each run of a scheduler pass took, calls to other daemons included (the control "
        "loop's passes, the status polls, the moves).",
        absl::StrCat("pass=\"", p.name, "\""));
  };
  for (Pass& p : control_passes_) timed(p);
  timed(poll_pass_);
  timed(moves_pass_);
}

void Scheduler::RunPass(const Pass& pass) {
  const absl::Time start = absl::Now();  // Real time, even under a test's fake clock.
  (this->*pass.run)();
  pass.seconds->ObserveSeconds(absl::Now() - start);
}

void Scheduler::ControlPass() {
  absl::MutexLock pass(&loop_mu_);
  // A failed write stops the pass where it happened, and every pass after it until the store
  // works again: nothing that was not written is published.
  if (!StoreWorks()) return;
  for (const Pass& p : control_passes_) {
    if (!store_status().ok()) return;
    RunPass(p);
  }
}

void Scheduler::CheckLeases() {
  std::vector<std::string> died = registry_.ExpireLeases();
  if (died.empty()) return;
  absl::MutexLock l(&mu_);
  for (const std::string& id : died) {
    Log()->warn("{} stopped heartbeating: lease of {} expired", Describe(id),
                absl::FormatDuration(options_.lease));
    FailJobsOnNode(id, absl::StrCat("stopped heartbeating (lease of ",
                                    absl::FormatDuration(options_.lease), " expired)"));
  }
}

void Scheduler::PollServers() {
  struct Poll {
    std::string job_id;
    std::vector<std::string> addresses;
    std::vector<std::string> nodes;  // node_id of each address
  };
  std::vector<Poll> polls;
  absl::Time now = clock_->Now();
  {
    absl::MutexLock l(&mu_);
    // A quota on server memory needs every running job's memory.
    const bool memory = quotas_ != nullptr && quotas_->limits_memory();
    for (JobRecord& rec : jobs_) {
      const std::string& id = rec.job.job_id();
      if (rec.job.state() != v1::JOB_RUNNING) continue;
      // Who is waited for (BSP, SSP); whether primaries reach their backups (replicas).
      if (rec.job.spec().consistency().mode() == v1::ConsistencySpec::ASP &&
          rec.job.spec().replication() <= 1 && !memory) {
        continue;
      }
      if (now - rec.last_poll < options_.status_poll_interval) continue;
      rec.last_poll = now;
      Poll p{id, {}, {}};
      for (const v1::ServerEndpoint& ep : rec.shard_map.servers()) {
        p.addresses.push_back(ep.address());
        p.nodes.push_back(ep.node_id());
      }
      polls.push_back(std::move(p));
    }
  }
  ParallelFor(polls.size(), [&](size_t i) {
    const Poll& p = polls[i];
    std::set<uint32_t> waiting;
    std::set<std::pair<std::string, std::string>> unreachable;  // (primary, backup address)
    bool any = false;
    uint64_t bytes = 0;
    for (size_t k = 0; k < p.addresses.size(); ++k) {
      auto st = rpc_->ServerStatus(p.addresses[k], p.job_id);
      if (!st.ok()) {
        Log()->debug("job {}: {}", p.job_id, st.status());
        continue;
      }
      any = true;
      for (const v1::JobOnServer& j : st->jobs()) {
        if (j.job_id() != p.job_id) continue;
        waiting.insert(j.waiting_for().begin(), j.waiting_for().end());
        for (const std::string& b : j.unreachable_backups()) unreachable.emplace(p.nodes[k], b);
        for (const v1::TableStatus& t : j.tables()) bytes += t.bytes();
      }
    }
    if (!any) return;
    absl::MutexLock l(&mu_);
    JobRecord* rec = jobs_.Find(p.job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RUNNING) return;
    for (const auto& [primary, address] : unreachable) {
      for (const v1::ServerEndpoint& ep : rec->shard_map.servers()) {
        if (ep.address() == address) rec->unreachable_backups.emplace(primary, ep.node_id());
      }
    }
    rec->server_waiting_for.assign(waiting.begin(), waiting.end());
    rec->server_bytes = bytes;
    Summarize(rec->job.spec(), rec->server_waiting_for, rec->job.mutable_progress());
  });
}

void Scheduler::RunCleanups() {
  std::vector<Cleanup> due;
  absl::Time now = clock_->Now();
  {
    absl::MutexLock l(&mu_);
    std::deque<Cleanup> later;
    while (!cleanups_.empty()) {
      Cleanup c = std::move(cleanups_.front());
      cleanups_.pop_front();
      const JobRecord* rec = jobs_.Find(c.job_id);
      // A job placed again since holds these nodes anew: leave them alone. A stale copy or
      // task is left alone only if the job holds that very node again.
      if (rec != nullptr && HoldsResources(rec->job.state())) {
        const auto& nodes = c.drop_job ? rec->job.servers() : rec->job.workers();
        if (!c.stale_copy || std::find(nodes.begin(), nodes.end(), c.node_id) != nodes.end()) {
          continue;
        }
      }
      if (c.not_before > now) {
        later.push_back(std::move(c));
      } else {
        due.push_back(std::move(c));
      }
    }
    cleanups_ = std::move(later);
  }
  // Tasks are stopped before the job is dropped on the servers.
  std::stable_partition(due.begin(), due.end(), [](const Cleanup& c) { return !c.drop_job; });
  auto run = [&](size_t i) {
    Cleanup& c = due[i];
    auto node = registry_.Get(c.node_id);
    if (!node.has_value() || !IsLive(*node)) return;  // Gone: nothing to free there.
    const std::string& addr = node->info().address();
    if (c.drop_job && now < c.stop_deadline && WorkerStillRuns(c.stopping_workers, c.job_id)) {
      c.not_before = now + kStopRecheck;  // Not an attempt: the workers are stopping.
      absl::MutexLock l(&mu_);
      cleanups_.push_back(std::move(c));
      return;
    }
    absl::Status s = c.drop_job ? rpc_->DropJob(addr, c.job_id)
                                : rpc_->StopTask(addr, c.job_id, c.reason);
    if (s.ok()) return;
    if (++c.attempts == kCleanupWarnAfter) {
      Log()->warn("job {}: {} at {} failed {} times (last: {}); retrying while the node is live",
                  c.job_id, c.drop_job ? "DropJob" : "StopTask", c.node_id, c.attempts, s);
    }
    c.not_before =
        now + std::min(kCleanupRetryMax, kCleanupRetry * (1 << std::min(c.attempts - 1, 5)));
    absl::MutexLock l(&mu_);
    cleanups_.push_back(std::move(c));
  };
  const size_t stops = std::count_if(due.begin(), due.end(),
                                     [](const Cleanup& c) { return !c.drop_job; });
  ParallelFor(stops, run);
  ParallelFor(due.size() - stops, [&](size_t i) { run(stops + i); });
}

bool Scheduler::WorkerStillRuns(const std::vector<std::string>& workers,
                                const std::string& job_id) {
  std::atomic<bool> any{false};
  ParallelFor(workers.size(), [&](size_t i) {
    auto node = registry_.Get(workers[i]);
    if (!node.has_value() || !IsLive(*node)) return;
    auto ws = rpc_->WorkerStatus(node->info().address());
    // An unreachable worker cannot be waited for.
    if (ws.ok() && ws->busy() && ws->job_id() == job_id) any = true;
  });
  return any.load();
}

void Scheduler::PersistProgress() {
  absl::Time now = clock_->Now();
  absl::MutexLock l(&mu_);
  for (JobRecord& rec : jobs_) {
    if (rec.progress_dirty && now - rec.last_persist >= options_.progress_persist_interval &&
        !jobs_.Persist(rec).ok()) {
      return;  // The store failed (logged); progress is written again once it works.
    }
  }
}

}  // namespace pscluster::scheduler
