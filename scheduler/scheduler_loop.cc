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
  for (auto& [id, rec] : jobs_) {
    if (rec.progress_dirty && !Persist(rec).ok()) break;  // The store failed: logged.
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
    PollServers();
  }
}

void Scheduler::RunOnce() {
  ControlPass();
  PollServers();
}

void Scheduler::ControlPass() {
  absl::MutexLock pass(&loop_mu_);
  // A failed write stops the pass where it happened, and every pass after it until the store
  // works again: nothing that was not written is published.
  if (!StoreWorks()) return;
  auto works = [this] { return store_status().ok(); };
  CheckLeases();
  if (works()) VerifyTasksAfterRestart();
  if (works()) HandOverRanks();
  if (works()) DropUnreachableBackups();
  if (works()) ReplaceBackups();
  if (works()) RecoverJobs();
  if (works()) {
    for (const PlacementWork& w : PlaceQueuedJobs()) ExecutePlacement(w);
  }
  if (works()) RejoinRanks();
  if (works()) BalanceData();
  if (works()) RunCleanups();
  if (works()) PersistProgress();
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
    for (const std::string& id : order_) {
      JobRecord& rec = jobs_[id];
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
    JobRecord* rec = FindJob(p.job_id);
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
      const JobRecord* rec = FindJob(c.job_id);
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
  for (auto& [id, rec] : jobs_) {
    if (rec.progress_dirty && now - rec.last_persist >= options_.progress_persist_interval &&
        !Persist(rec).ok()) {
      return;  // The store failed (logged); progress is written again once it works.
    }
  }
}

}  // namespace pscluster::scheduler
