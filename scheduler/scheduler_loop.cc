// The scheduler's control loop: leases, placement, server status polls, cleanups, persistence.
// Every call to another daemon happens here, outside `mu_`.
#include <algorithm>
#include <atomic>
#include <functional>
#include <set>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "scheduler/job_state.h"
#include "scheduler/progress.h"
#include "scheduler/parallel.h"
#include "scheduler/recovery.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {
namespace {

constexpr int kMaxCleanupAttempts = 3;
constexpr absl::Duration kCleanupRetry = absl::Seconds(1);
// How often a job's DropJob looks again whether its workers have stopped.
constexpr absl::Duration kStopRecheck = absl::Milliseconds(100);
// How soon a placement that waits for workers still stopping an ended job's task looks again.
constexpr absl::Duration kStoppingRetry = absl::Milliseconds(200);

std::shared_ptr<spdlog::logger> Log() { return Logger("scheduler"); }

int64_t UnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

// Calls `call` on every server of `map` at once; returns each one's clock, and in *why the first
// failure, naming its server (empty: none).
std::vector<int64_t> ClockOnEveryServer(
    const v1::ShardMap& map,
    const std::function<absl::StatusOr<int64_t>(const v1::ServerEndpoint&)>& call,
    std::string* why) {
  std::vector<int64_t> clocks(map.servers_size(), -1);
  std::vector<std::string> errors(map.servers_size());
  ParallelFor(map.servers_size(), [&](size_t i) {
    const v1::ServerEndpoint& ep = map.servers(i);
    auto clock = call(ep);
    if (clock.ok() && *clock >= 0) {
      clocks[i] = *clock;
    } else {
      errors[i] = clock.ok() ? absl::StrCat("server ", ep.node_id(), " reports no clock for it")
                             : absl::StrCat("server ", ep.node_id(), ": ",
                                            clock.status().message());
    }
  });
  why->clear();
  for (const std::string& e : errors) {
    if (why->empty()) *why = e;
  }
  return clocks;
}

bool IsLive(const v1::NodeStatus& n) {
  return n.state() == v1::NODE_ALIVE || n.state() == v1::NODE_SUSPECT;
}

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

uint32_t Scheduler::RankAttempt(const v1::JobRecovery& recovery, uint32_t rank) {
  return static_cast<int>(rank) < recovery.rank_attempts_size() ? recovery.rank_attempts(rank)
                                                                 : recovery.recoveries();
}

uint32_t Scheduler::NextAttempt(const v1::JobRecovery& recovery, uint32_t num_workers) {
  uint32_t top = recovery.recoveries();
  for (uint32_t r = 0; r < num_workers; ++r) top = std::max(top, RankAttempt(recovery, r));
  for (uint32_t a : recovery.rank_attempts()) top = std::max(top, a);
  return top + 1;
}

v1::AssignTaskRequest Scheduler::TaskFor(const std::string& job_id, const v1::JobSpec& spec,
                                         const v1::ShardMap& map, uint32_t rank,
                                         uint32_t num_workers, const v1::JobRecovery& recovery) {
  v1::AssignTaskRequest req;
  req.set_job_id(job_id);
  *req.mutable_spec() = spec;
  req.set_rank(rank);
  req.set_num_workers(num_workers);
  *req.mutable_partition() = PartitionFor(recovery, rank, num_workers);
  *req.mutable_shard_map() = map;
  req.set_start_step(recovery.start_step());
  req.set_attempt(RankAttempt(recovery, rank));
  req.set_lead_rank(LeadRank(recovery, num_workers));
  req.set_training_ranks(num_workers - std::min<uint32_t>(num_workers, recovery.left_size()));
  return req;
}

v1::DataPartition Scheduler::PartitionFor(const v1::JobRecovery& recovery, uint32_t rank,
                                          uint32_t num_workers) {
  v1::DataPartition p;
  p.set_index(rank);
  p.set_count(num_workers);
  if (recovery.data_shares_size() == static_cast<int>(num_workers)) {
    *p.mutable_shares() = recovery.data_shares();
  }
  for (const v1::LeftRank& l : recovery.left()) {
    if (l.adopted_by() == rank && l.rank() != rank) p.add_also(l.rank());
  }
  return p;
}

v1::UpdatePartitionRequest Scheduler::PartitionUpdate(const std::string& job_id,
                                                     const v1::JobRecovery& recovery,
                                                     uint32_t rank, uint32_t num_workers) {
  v1::UpdatePartitionRequest up;
  up.set_job_id(job_id);
  up.set_rank(rank);
  up.set_attempt(RankAttempt(recovery, rank));
  *up.mutable_partition() = PartitionFor(recovery, rank, num_workers);
  up.set_lead_rank(LeadRank(recovery, num_workers));
  up.set_training_ranks(num_workers - std::min<uint32_t>(num_workers, recovery.left_size()));
  return up;
}

uint32_t Scheduler::LeadRank(const v1::JobRecovery& recovery, uint32_t num_workers) {
  for (uint32_t r = 0; r < num_workers; ++r) {
    bool left = false;
    for (const v1::LeftRank& l : recovery.left()) left = left || l.rank() == r;
    if (!left) return r;
  }
  return 0;
}

void Scheduler::VerifyTasksAfterRestart() {
  struct Check {
    std::string job_id;
    uint32_t rank = 0;
    uint32_t attempt = 0;
    std::string node, address;
  };
  std::vector<Check> checks;
  {
    absl::MutexLock l(&mu_);
    // Nodes re-register and heartbeat first.
    if (!verify_tasks_ || clock_->Now() - started_ < StartupGrace()) return;
    verify_tasks_ = false;
    for (const std::string& id : order_) {
      const v1::Job& job = jobs_[id].job;
      if (job.state() != v1::JOB_RUNNING) continue;
      for (int r = 0; r < job.workers_size(); ++r) {
        if (r < job.progress().workers_size() && job.progress().workers(r).done()) continue;
        auto node = registry_.Get(job.workers(r));
        if (!node.has_value() || !IsLive(*node)) continue;  // The lease deals with those.
        checks.push_back(Check{id, static_cast<uint32_t>(r),
                               RankAttempt(job.recovery(), static_cast<uint32_t>(r)),
                               job.workers(r), node->info().address()});
      }
    }
  }
  std::vector<std::string> gone(checks.size());
  ParallelFor(checks.size(), [&](size_t i) {
    const Check& c = checks[i];
    auto ws = rpc_->WorkerStatus(c.address);
    if (!ws.ok()) return;  // Unreachable: its lease decides.
    if (ws->busy() && ws->job_id() == c.job_id && ws->rank() == c.rank &&
        ws->attempt() == c.attempt) {
      return;
    }
    gone[i] = ws->busy() ? absl::StrCat("runs job ", ws->job_id(), " rank ", ws->rank(),
                                        " attempt ", ws->attempt(), " instead of its task")
                         : std::string("runs no task");
  });
  absl::MutexLock l(&mu_);
  for (size_t i = 0; i < checks.size(); ++i) {
    if (gone[i].empty()) continue;
    const Check& c = checks[i];
    JobRecord* rec = FindJob(c.job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RUNNING ||
        static_cast<int>(c.rank) >= rec->job.workers_size() ||
        rec->job.workers(c.rank) != c.node ||
        (static_cast<int>(c.rank) < rec->job.progress().workers_size() &&
         rec->job.progress().workers(c.rank).done())) {
      continue;  // Finished or changed meanwhile.
    }
    std::string reason = absl::StrCat("worker of rank ", c.rank, " ", Describe(c.node), " ",
                                      gone[i], " (found after a scheduler restart)");
    if (!MayRecover(*rec, reason)) continue;
    rec->lost_ranks.push_back({c.rank, reason});
    Log()->warn("job {}: {}; handing its rank over", c.job_id, reason);
    Wake();
  }
}

void Scheduler::HandOverRanks() {
  struct Work {
    std::string job_id;
    uint32_t rank = 0;
    std::string cause;
    std::string lost;  // Node that ran the rank.
    std::string spare, spare_address;
    v1::JobSpec spec;
    v1::ShardMap map;
    uint32_t num_workers = 0;
    v1::JobRecovery recovery;
    // The rank leaves the job instead (no idle worker; the job may shrink): `adopter` (rank)
    // reads its data from then on, on `adopter_address`.
    bool leave = false;
    uint32_t adopter = 0;
    std::string adopter_address;
  };
  {
    absl::MutexLock l(&mu_);
    bool any = false;
    for (const auto& [id, rec] : jobs_) {
      any = any || !rec.lost_ranks.empty();
      // A rank whose leaving did not finish (the scheduler stopped half-way).
      for (const v1::LeftRank& left : rec.job.recovery().left()) {
        any = any || (rec.job.state() == v1::JOB_RUNNING && left.step() < 0);
      }
      // Also workers of running jobs found dead without an event (after a scheduler restart).
      if (rec.job.state() != v1::JOB_RUNNING) continue;
      for (const std::string& w : rec.job.workers()) {
        auto n = registry_.Get(w);
        any = any || (n.has_value() && !IsLive(*n));
      }
    }
    if (!any) return;
  }
  const std::vector<v1::NodeStatus> nodes = registry_.Snapshot();
  absl::flat_hash_map<std::string, const v1::NodeStatus*> by_id;
  for (const v1::NodeStatus& n : nodes) by_id[n.info().node_id()] = &n;

  // Under the lock: choose an idle worker per lost rank and assign the rank to it in the job
  // (so that its first progress report is accepted).
  std::vector<Work> work;
  {
    absl::MutexLock l(&mu_);
    // `rank` of `rec` leaves the job, recorded so (nullopt: it may not, as fewer than
    // spec.min_workers live ranks would remain). The live rank still training that reads the
    // fewest parts takes its data, and the data of the ranks it had taken over.
    auto leave_rank = [&](JobRecord& rec, uint32_t rank,
                          const std::string& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
        -> std::optional<Work> {
      v1::Job& job = rec.job;
      const uint32_t n = job.workers_size();
      v1::JobRecovery* rr = job.mutable_recovery();
      uint32_t remaining = 0;
      std::optional<uint32_t> adopter;
      size_t adopter_parts = 0;
      for (uint32_t q = 0; q < n; ++q) {
        if (q == rank || job.workers(q).empty()) continue;
        auto it = by_id.find(job.workers(q));
        if (it == by_id.end() || !IsLive(*it->second)) continue;
        ++remaining;
        if (static_cast<int>(q) < job.progress().workers_size() &&
            job.progress().workers(q).done()) {
          continue;  // Finished: reads no more data.
        }
        size_t parts = PartitionFor(*rr, q, n).also_size();
        if (!adopter.has_value() || parts < adopter_parts) {
          adopter = q;
          adopter_parts = parts;
        }
      }
      if (remaining < std::max(1u, job.spec().min_workers())) return std::nullopt;
      const std::string old = job.workers(rank);
      const uint32_t takes = adopter.value_or(rank);  // `rank` itself: nobody reads it on.
      for (v1::LeftRank& l : *rr->mutable_left()) {
        if (l.adopted_by() == rank) l.set_adopted_by(takes);
      }
      v1::LeftRank* left = rr->add_left();
      left->set_rank(rank);
      left->set_node_id(old);
      left->set_cause(cause);
      left->set_adopted_by(takes);
      left->set_step(-1);  // Known once every server has taken it out (FinishLeaving).
      left->set_unix_ms(UnixMs(clock_->Now()));
      // Its attempt moves on: reports of a task of it still running (a worker cut off) are
      // ignored, and the servers refuse every attempt of it once it has left.
      const uint32_t next = NextAttempt(*rr, n);
      while (static_cast<uint32_t>(rr->rank_attempts_size()) < n) {
        rr->add_rank_attempts(RankAttempt(*rr, rr->rank_attempts_size()));
      }
      rr->set_rank_attempts(rank, next);
      job.set_workers(rank, "");  // No node runs it any more.
      if (static_cast<int>(rank) < job.progress().workers_size()) {
        v1::WorkerProgress* p = job.mutable_progress()->mutable_workers(rank);
        p->set_left(true);
        p->set_done(true);
        p->set_samples_per_sec(0);
        p->clear_error();
      }
      Summarize(job.spec(), rec.server_waiting_for, job.mutable_progress());
      if (!Persist(rec).ok()) return std::nullopt;  // Not written: not sent either.
      Work w;
      w.job_id = job.job_id();
      w.rank = rank;
      w.cause = cause;
      w.lost = old;
      w.spec = job.spec();
      w.map = rec.shard_map;
      w.num_workers = n;
      w.recovery = job.recovery();
      w.leave = true;
      w.adopter = takes;
      if (adopter.has_value()) w.adopter_address = by_id[job.workers(*adopter)]->info().address();
      return w;
    };
    absl::flat_hash_set<std::string> busy;
    for (const auto& [id, rec] : jobs_) {
      if (!HoldsResources(rec.job.state())) continue;
      for (const std::string& w : rec.job.workers()) busy.insert(w);
    }
    for (const std::string& id : order_) {
      JobRecord& rec = jobs_[id];
      v1::Job& job = rec.job;
      if (job.state() != v1::JOB_RUNNING) {
        rec.lost_ranks.clear();
        continue;
      }
      // Leavings recorded but not finished (every leaving finishes, or rolls the job back,
      // within the pass that records it): the scheduler stopped half-way. Again, with the same
      // adopter; a server that has already taken the rank out answers the same.
      for (const v1::LeftRank& left : job.recovery().left()) {
        if (left.step() >= 0) continue;
        Work w;
        w.job_id = id;
        w.rank = left.rank();
        w.cause = left.cause();
        w.lost = left.node_id();
        w.spec = job.spec();
        w.map = rec.shard_map;
        w.num_workers = job.workers_size();
        w.recovery = job.recovery();
        w.leave = true;
        w.adopter = left.adopted_by();
        if (w.adopter < static_cast<uint32_t>(job.workers_size())) {
          auto it = by_id.find(job.workers(w.adopter));
          if (it != by_id.end()) w.adopter_address = it->second->info().address();
        }
        work.push_back(std::move(w));
      }
      for (int r = 0; r < job.workers_size(); ++r) {
        auto it = by_id.find(job.workers(r));
        bool known = false;
        for (const auto& lr : rec.lost_ranks) known = known || lr.rank == static_cast<uint32_t>(r);
        if (it == by_id.end() || IsLive(*it->second) || known) continue;
        std::string reason = absl::StrCat("worker of rank ", r, " ", Describe(job.workers(r)),
                                          " is no longer alive");
        if (!MayRecover(rec, reason)) break;
        rec.lost_ranks.push_back({static_cast<uint32_t>(r), reason});
      }
      if (job.state() != v1::JOB_RUNNING || rec.lost_ranks.empty()) continue;
      std::vector<JobRecord::LostRank> lost;
      lost.swap(rec.lost_ranks);
      for (const JobRecord::LostRank& lr : lost) {
        const uint32_t rank = lr.rank;
        const std::string& cause = lr.cause;
        // An idle live worker able to run the task; a restarted one may take its rank back. A
        // worker whose task failed for a reason another may not meet gets it back only when no
        // other worker is idle.
        const std::string old = job.workers(rank);
        std::string same, other;
        for (const v1::NodeStatus& n : nodes) {
          const std::string& nid = n.info().node_id();
          if (n.info().role() != v1::ROLE_WORKER || n.state() != v1::NODE_ALIVE) continue;
          if (busy.contains(nid) && nid != old) continue;
          if (n.info().capacity().gpus() < job.spec().gpus_per_worker()) continue;
          if (nid == old) {
            same = nid;
          } else if (other.empty()) {
            other = nid;
          }
        }
        const std::string spare = lr.avoid_node ? (other.empty() ? same : other)
                                                : (same.empty() ? other : same);
        if (spare.empty()) {
          // No idle worker: the rank leaves the job when enough others train on (one of them
          // reads its data from then on); otherwise the job rolls back and waits for workers.
          std::optional<Work> leave = leave_rank(rec, rank, cause);
          if (!leave.has_value()) {
            StartRecovery(rec, absl::StrCat(cause, "; no idle worker to take its rank"));
            break;
          }
          work.push_back(std::move(*leave));
          continue;
        }
        busy.insert(spare);
        job.set_workers(rank, spare);
        {
          // The new task's attempt: above every earlier one, so that the servers can fence
          // the old task off.
          v1::JobRecovery* rr = job.mutable_recovery();
          const uint32_t n = job.workers_size();
          const uint32_t next = NextAttempt(*rr, n);
          while (static_cast<uint32_t>(rr->rank_attempts_size()) < n) {
            rr->add_rank_attempts(RankAttempt(*rr, rr->rank_attempts_size()));
          }
          rr->set_rank_attempts(rank, next);
        }
        if (static_cast<int>(rank) < job.progress().workers_size()) {
          v1::WorkerProgress* p = job.mutable_progress()->mutable_workers(rank);
          p->set_node_id(spare);
          p->set_done(false);
          p->clear_error();
        }
        if (!Persist(rec).ok()) break;  // Not written: not sent either.
        Work w;
        w.job_id = id;
        w.rank = rank;
        w.cause = cause;
        w.lost = old;
        w.spare = spare;
        w.spare_address = by_id[spare]->info().address();
        w.spec = job.spec();
        w.map = rec.shard_map;
        w.num_workers = job.workers_size();
        w.recovery = job.recovery();
        work.push_back(std::move(w));
      }
    }
  }

  for (Work& w : work) {
    if (w.leave) {
      FinishLeaving(w.job_id, w.rank, w.cause, w.lost, w.map, w.num_workers, w.recovery,
                    w.adopter, w.adopter_address);
      continue;
    }
    // Every server fences the rank at the new task's attempt first: the old task, should it
    // still run (paused, or cut off from the scheduler only), is refused from then on and
    // cannot advance the rank's clock. The new worker resumes the rank at its slowest clock on
    // the servers: each server's exactly-once tags drop the part of that step the old task had
    // already pushed there.
    std::string why;
    std::vector<int64_t> clocks = ClockOnEveryServer(
        w.map,
        [&](const v1::ServerEndpoint& ep) {
          return rpc_->FenceWorker(ep.address(), w.job_id, w.rank,
                                   RankAttempt(w.recovery, w.rank));
        },
        &why);
    int64_t start = clocks.empty() ? 0 : *std::min_element(clocks.begin(), clocks.end());
    if (why.empty()) {
      v1::JobRecovery at = w.recovery;
      at.set_start_step(start);
      absl::Status s = rpc_->AssignTask(
          w.spare_address, TaskFor(w.job_id, w.spec, w.map, w.rank, w.num_workers, at));
      if (!s.ok()) why = absl::StrCat("worker ", w.spare, ": ", s.message());
    }
    bool undo = false;
    {
      absl::MutexLock l(&mu_);
      JobRecord* rec = FindJob(w.job_id);
      const bool current = rec != nullptr && rec->job.state() == v1::JOB_RUNNING &&
                           static_cast<int>(w.rank) < rec->job.workers_size() &&
                           rec->job.workers(w.rank) == w.spare;
      if (!current) {
        // Cancelled or recovering from another loss meanwhile: the new task must not run on.
        undo = why.empty();
      } else if (!why.empty()) {
        StartRecovery(*rec,
                      absl::StrCat(w.cause, "; its rank could not be handed over (", why, ")"));
      } else {
        v1::JobRecovery* r = rec->job.mutable_recovery();
        r->set_handovers(r->handovers() + 1);
        r->set_last_cause(w.cause);
        r->set_recovered_unix_ms(UnixMs(clock_->Now()));
        if (!Persist(*rec).ok()) continue;
        handovers_->Add();
        Log()->warn("job {}: rank {} handed over from {} to {}, resuming at step {} with no "
                    "rollback: {}",
                    w.job_id, w.rank, w.lost, w.spare, start, w.cause);
      }
    }
    if (undo) (void)rpc_->StopTask(w.spare_address, w.job_id, "the job changed meanwhile");
  }
}

void Scheduler::FinishLeaving(const std::string& job_id, uint32_t rank, const std::string& cause,
                              const std::string& lost, const v1::ShardMap& map,
                              uint32_t num_workers, const v1::JobRecovery& recovery,
                              uint32_t adopter, const std::string& adopter_address) {
  // 1. Every server takes the rank out of the job's barrier (and refuses it from then on).
  std::string why;
  std::vector<int64_t> clocks = ClockOnEveryServer(
      map,
      [&](const v1::ServerEndpoint& ep) { return rpc_->LeaveJob(ep.address(), job_id, rank); },
      &why);
  // 2. The rank that takes its data reads it from its next batch on (and every remaining rank
  //    learns the lead rank, which changes when rank 0 leaves).
  std::string adopted = "nobody (every other rank had finished)";
  if (why.empty()) {
    std::vector<std::pair<uint32_t, std::string>> remaining;
    bool aggregate = false;
    {
      absl::MutexLock l(&mu_);
      JobRecord* rec = FindJob(job_id);
      if (rec != nullptr) {
        aggregate = rec->job.spec().consistency().aggregate();
        for (int q = 0; q < rec->job.workers_size(); ++q) {
          if (rec->job.workers(q).empty()) continue;
          auto node = registry_.Get(rec->job.workers(q));
          if (node.has_value()) remaining.emplace_back(q, node->info().address());
        }
      }
    }
    const uint32_t lead = LeadRank(recovery, num_workers);
    v1::JobRecovery before = recovery;
    for (int i = 0; i < before.left_size(); ++i) {
      if (before.left(i).rank() == rank) {
        before.mutable_left()->DeleteSubrange(i, 1);
        break;
      }
    }
    // Aggregate steps average over the ranks training: every rank learns their count.
    const bool everyone = LeadRank(before, num_workers) != lead || aggregate;
    std::vector<absl::Status> updated(remaining.size());
    ParallelFor(remaining.size(), [&](size_t i) {
      const uint32_t q = remaining[i].first;
      if (q != adopter && !everyone) return;  // Neither its data nor the lead changes.
      updated[i] = rpc_->UpdatePartition(q == adopter ? adopter_address : remaining[i].second,
                                         PartitionUpdate(job_id, recovery, q, num_workers));
    });
    for (size_t i = 0; i < remaining.size(); ++i) {
      if (updated[i].ok()) continue;
      Log()->warn("job {}: rank {} was not told of its new data partition: {}", job_id,
                  remaining[i].first, updated[i].message());
    }
    if (adopter != rank) adopted = absl::StrCat("rank ", adopter);
  }
  absl::MutexLock l(&mu_);
  JobRecord* rec = FindJob(job_id);
  if (rec == nullptr || rec->job.state() != v1::JOB_RUNNING) return;  // Changed meanwhile.
  v1::Job& job = rec->job;
  if (!why.empty()) {
    StartRecovery(*rec, absl::StrCat(cause, "; its rank could not leave the job (", why, ")"));
    return;
  }
  v1::JobRecovery* r = job.mutable_recovery();
  int64_t step = clocks.empty() ? 0 : *std::min_element(clocks.begin(), clocks.end());
  for (v1::LeftRank& left : *r->mutable_left()) {
    if (left.rank() == rank) left.set_step(step);
  }
  r->set_last_cause(cause);
  r->set_recovered_unix_ms(UnixMs(clock_->Now()));
  if (!Persist(*rec).ok()) return;
  leaves_->Add();
  uint32_t training = 0;
  for (const std::string& w : job.workers()) training += w.empty() ? 0 : 1;
  Log()->warn("job {}: rank {} (worker {}) left the job at step {} ({}; no idle worker to take "
              "it): {} reads its data from now on, {} of {} ranks train on with no rollback",
              job_id, rank, lost, step, cause, adopted, training, num_workers);
  MaybeSucceed(*rec);
  Wake();
}

void Scheduler::DropUnreachableBackups() {
  struct Work {
    std::string job_id;
    v1::ShardMap map;
    std::string what;  // For the log.
  };
  std::vector<Work> work;
  {
    absl::MutexLock l(&mu_);
    for (const std::string& id : order_) {
      JobRecord& rec = jobs_[id];
      if (rec.job.state() != v1::JOB_RUNNING) {
        rec.unreachable_backups.clear();
        continue;
      }
      if (rec.unreachable_backups.empty() && !rec.resend_map) continue;
      v1::ShardMap next = rec.shard_map;
      std::vector<std::string> dropped;
      for (const auto& [primary, backup] : rec.unreachable_backups) {
        auto node = registry_.Get(backup);
        if (!node.has_value() || !IsLive(*node)) continue;  // A lost server is recovered from.
        uint32_t shards = 0;
        for (v1::ShardAssignment& a : *next.mutable_assignments()) {
          if (a.primary() != primary) continue;
          auto it = std::find(a.backups().begin(), a.backups().end(), backup);
          if (it == a.backups().end()) continue;
          a.mutable_backups()->erase(it);
          ++shards;
          bool known = false;
          for (const v1::BackupCut& c : rec.job.recovery().cut_backups()) {
            known = known || (c.primary() == primary && c.backup() == backup);
          }
          if (!known) {
            v1::BackupCut* cut = rec.job.mutable_recovery()->add_cut_backups();
            cut->set_primary(primary);
            cut->set_backup(backup);
          }
        }
        if (shards > 0) {
          dropped.push_back(absl::StrCat(backup, " as backup of ", shards, " shard(s) of ",
                                         primary));
        }
      }
      rec.unreachable_backups.clear();
      if (dropped.empty() && !rec.resend_map) continue;
      if (!dropped.empty()) {
        next.set_epoch(next.epoch() + 1);
        // Servers no assignment names any more leave the map.
        absl::flat_hash_set<std::string> named;
        for (const v1::ShardAssignment& a : next.assignments()) {
          named.insert(a.primary());
          named.insert(a.backups().begin(), a.backups().end());
        }
        auto* servers = next.mutable_servers();
        for (const v1::ServerEndpoint& ep : *servers) {
          if (named.contains(ep.node_id())) continue;
          Cleanup c;  // Its copy is of no use any more.
          c.drop_job = true;
          c.stale_copy = true;
          c.node_id = ep.node_id();
          c.job_id = id;
          c.reason = "its primary could not reach it";
          c.not_before = absl::InfinitePast();
          cleanups_.push_back(std::move(c));
        }
        servers->erase(std::remove_if(servers->begin(), servers->end(),
                                      [&](const v1::ServerEndpoint& ep) {
                                        return !named.contains(ep.node_id());
                                      }),
                       servers->end());
        rec.shard_map = next;
        rec.job.set_shard_map_epoch(next.epoch());
        rec.job.clear_servers();
        for (const v1::ServerEndpoint& ep : next.servers()) rec.job.add_servers(ep.node_id());
        if (!Persist(rec, &next).ok()) break;  // Not written: not sent either.
        backups_dropped_->Add(dropped.size());
      }
      rec.resend_map = false;
      work.push_back({id, next, absl::StrJoin(dropped, "; ")});
    }
  }
  for (const Work& w : work) {
    // Every server of the map at once: the primaries stop waiting for the dropped backups,
    // which drop their copies; clients at the older epoch refresh their map and retry.
    std::vector<absl::Status> status(w.map.servers_size());
    ParallelFor(w.map.servers_size(), [&](size_t i) {
      v1::UpdateShardMapRequest req;
      *req.mutable_map() = w.map;
      req.set_self(w.map.servers(i).node_id());
      status[i] = rpc_->UpdateShardMap(w.map.servers(i).address(), req);
    });
    std::string why;
    for (int i = 0; i < w.map.servers_size(); ++i) {
      if (!status[i].ok() && why.empty()) {
        why = absl::StrCat("server ", w.map.servers(i).node_id(), ": ", status[i].message());
      }
    }
    if (!w.what.empty()) {
      Log()->warn("job {}: dropped {}: the primary could not deliver copies to it (map epoch {})",
                  w.job_id, w.what, w.map.epoch());
    }
    if (!why.empty()) {
      Log()->warn("job {}: map epoch {} not installed everywhere ({}); sending it again",
                  w.job_id, w.map.epoch(), why);
      absl::MutexLock l(&mu_);
      JobRecord* rec = FindJob(w.job_id);
      if (rec != nullptr && rec->shard_map.epoch() == w.map.epoch()) rec->resend_map = true;
    }
  }
}

void Scheduler::ReplaceBackups() {
  struct Work {
    std::string job_id;
    v1::ShardMap before, after;
  };
  std::vector<Work> work;
  {
    absl::MutexLock l(&mu_);
    for (const std::string& id : order_) {
      JobRecord& rec = jobs_[id];
      const v1::JobSpec& spec = rec.job.spec();
      if (rec.job.state() != v1::JOB_RUNNING || spec.replication() <= 1 || rec.resend_map ||
          rec.job.recovery().cut_backups().empty() ||
          clock_->Now() < rec.replace_backups_after) {
        continue;
      }
      std::set<std::pair<std::string, std::string>> cut;
      for (const v1::BackupCut& c : rec.job.recovery().cut_backups()) {
        cut.insert({c.primary(), c.backup()});
      }
      std::vector<std::string> candidates;
      for (const v1::ServerEndpoint& ep : rec.shard_map.servers()) {
        auto node = registry_.Get(ep.node_id());
        if (node.has_value() && node->state() == v1::NODE_ALIVE) candidates.push_back(ep.node_id());
      }
      std::optional<v1::ShardMap> after =
          AddBackups(rec.shard_map, spec.replication(), candidates, cut);
      if (!after.has_value()) continue;
      Work w{id, rec.shard_map, *after};
      rec.shard_map = *after;
      rec.job.set_shard_map_epoch(after->epoch());
      if (!Persist(rec, &*after).ok()) break;  // Not written: not sent either.
      work.push_back(std::move(w));
    }
  }
  for (const Work& w : work) {
    // Every server at once, as after a promotion: each new backup waits for its primary's
    // snapshot, which the primary takes as the map takes effect there and sends ahead of every
    // update it forwards from then on (its pushes are acknowledged once the copies have them).
    std::vector<absl::Status> status(w.after.servers_size());
    ParallelFor(w.after.servers_size(), [&](size_t i) {
      v1::UpdateShardMapRequest req;
      *req.mutable_map() = w.after;
      req.set_self(w.after.servers(i).node_id());
      req.set_seed_new_backups(true);
      for (const std::string& p : NewlyBacked(w.before, w.after, req.self())) {
        v1::ReplicaSeed* seed = req.add_copy_from();
        seed->set_primary(p);
        seed->set_live(true);
      }
      status[i] = rpc_->UpdateShardMap(w.after.servers(i).address(), req);
    });
    std::string why;
    for (int i = 0; i < w.after.servers_size(); ++i) {
      if (!status[i].ok() && why.empty()) {
        why = absl::StrCat("server ", w.after.servers(i).node_id(), ": ", status[i].message());
      }
    }
    std::vector<std::string> added;
    for (const v1::ServerEndpoint& ep : w.after.servers()) {
      std::vector<std::string> of = NewlyBacked(w.before, w.after, ep.node_id());
      if (!of.empty()) {
        added.push_back(absl::StrCat(ep.node_id(), " for ", absl::StrJoin(of, ", ")));
      }
    }
    absl::MutexLock l(&mu_);
    JobRecord* rec = FindJob(w.job_id);
    if (rec == nullptr || rec->shard_map.epoch() != w.after.epoch()) continue;
    if (why.empty()) {
      backups_replaced_->Add();
      Log()->info("job {}: new backup(s) {} in place of unreachable ones (map epoch {})",
                  w.job_id, absl::StrJoin(added, "; "), w.after.epoch());
      continue;
    }
    // A server that missed the map would take it later without its seed: take the new copies
    // back out instead (a map without them, sent again until every server has it).
    v1::ShardMap undo = w.before;
    undo.set_epoch(w.after.epoch() + 1);
    rec->shard_map = undo;
    rec->job.set_shard_map_epoch(undo.epoch());
    if (!Persist(*rec, &undo).ok()) continue;  // Not written: not sent either.
    rec->resend_map = true;
    rec->replace_backups_after = clock_->Now() + options_.placement_backoff;
    Log()->warn("job {}: new backup(s) {} not installed everywhere ({}); taken out again (map "
                "epoch {}), tried again in {}",
                w.job_id, absl::StrJoin(added, "; "), why, undo.epoch(),
                absl::FormatDuration(options_.placement_backoff));
  }
}

void Scheduler::RejoinRanks() {
  struct Work {
    std::string job_id;
    uint32_t rank = 0;
    uint32_t adopter = 0;  // Read its part until now (the rank itself: nobody).
    std::string spare, spare_address;
    v1::JobSpec spec;
    v1::ShardMap map;
    uint32_t num_workers = 0;
    v1::JobRecovery recovery;  // With the rank back in, its new attempt set.
    uint32_t lead_before = 0;
  };
  {
    // Only while no job waits in the queue: queued jobs get idle workers first.
    absl::MutexLock l(&mu_);
    bool any = false;
    for (const auto& [id, rec] : jobs_) {
      if (rec.job.state() == v1::JOB_QUEUED) return;
      any = any || (rec.job.state() == v1::JOB_RUNNING && !rec.job.recovery().left().empty());
    }
    if (!any) return;
  }
  const std::vector<v1::NodeStatus> nodes = registry_.Snapshot();
  std::vector<Work> work;
  {
    absl::MutexLock l(&mu_);
    absl::flat_hash_set<std::string> busy;
    for (const auto& [id, rec] : jobs_) {
      if (!HoldsResources(rec.job.state())) continue;
      for (const std::string& w : rec.job.workers()) busy.insert(w);
    }
    for (const std::string& id : order_) {
      JobRecord& rec = jobs_[id];
      v1::Job& job = rec.job;
      if (job.state() != v1::JOB_RUNNING || job.recovery().left().empty()) continue;
      if (!rec.lost_ranks.empty()) continue;  // Its losses first.
      std::string spare, address;
      for (const v1::NodeStatus& n : nodes) {
        if (n.info().role() != v1::ROLE_WORKER || n.state() != v1::NODE_ALIVE) continue;
        if (busy.contains(n.info().node_id())) continue;
        if (n.info().capacity().gpus() < job.spec().gpus_per_worker()) continue;
        spare = n.info().node_id();
        address = n.info().address();
        break;
      }
      if (spare.empty()) break;  // No idle worker for this job or any later one.
      busy.insert(spare);
      // The rank that left first comes back first; one per job and pass.
      v1::JobRecovery* rr = job.mutable_recovery();
      const uint32_t n = job.workers_size();
      Work w;
      w.lead_before = LeadRank(*rr, n);
      const v1::LeftRank back = rr->left(0);
      rr->mutable_left()->DeleteSubrange(0, 1);
      const uint32_t next = NextAttempt(*rr, n);
      while (static_cast<uint32_t>(rr->rank_attempts_size()) < n) {
        rr->add_rank_attempts(RankAttempt(*rr, rr->rank_attempts_size()));
      }
      rr->set_rank_attempts(back.rank(), next);
      job.set_workers(back.rank(), spare);
      if (static_cast<int>(back.rank()) < job.progress().workers_size()) {
        v1::WorkerProgress* p = job.mutable_progress()->mutable_workers(back.rank());
        p->set_node_id(spare);
        p->set_left(false);
        p->set_done(false);
        p->clear_error();
        p->set_test_accuracy(-1);  // Its evaluation from before it left is stale.
        p->set_test_loss(-1);
      }
      if (!Persist(rec).ok()) break;  // Not written: not sent either.
      w.job_id = id;
      w.rank = back.rank();
      w.adopter = back.adopted_by();
      w.spare = spare;
      w.spare_address = address;
      w.spec = job.spec();
      w.map = rec.shard_map;
      w.num_workers = n;
      w.recovery = job.recovery();
      work.push_back(std::move(w));
    }
  }

  for (const Work& w : work) {
    // 1. Every server lets the rank back in at the slowest clock of the ranks training there,
    //    refusing its older attempts; the task resumes at the lowest of those.
    std::string why;
    std::vector<int64_t> clocks = ClockOnEveryServer(
        w.map,
        [&](const v1::ServerEndpoint& ep) {
          return rpc_->RejoinJob(ep.address(), w.job_id, w.rank,
                                 RankAttempt(w.recovery, w.rank));
        },
        &why);
    const int64_t start = clocks.empty() ? 0 : *std::min_element(clocks.begin(), clocks.end());
    // 2. Its task on the worker, reading its own part again; the rank that read that part
    //    meanwhile drops it (and every rank learns the lead rank if it changed).
    if (why.empty()) {
      v1::JobRecovery at = w.recovery;
      at.set_start_step(start);
      absl::Status s = rpc_->AssignTask(
          w.spare_address, TaskFor(w.job_id, w.spec, w.map, w.rank, w.num_workers, at));
      if (!s.ok()) why = absl::StrCat("worker ", w.spare, ": ", s.message());
    }
    if (why.empty()) {
      const uint32_t lead = LeadRank(w.recovery, w.num_workers);
      std::vector<std::pair<uint32_t, std::string>> tell;
      {
        absl::MutexLock l(&mu_);
        JobRecord* rec = FindJob(w.job_id);
        for (int q = 0; rec != nullptr && q < rec->job.workers_size(); ++q) {
          const std::string& node = rec->job.workers(q);
          if (node.empty() || static_cast<uint32_t>(q) == w.rank) continue;
          if (static_cast<uint32_t>(q) != w.adopter && lead == w.lead_before &&
              !w.spec.consistency().aggregate()) {
            continue;
          }
          auto n = registry_.Get(node);
          if (n.has_value()) tell.emplace_back(q, n->info().address());
        }
      }
      ParallelFor(tell.size(), [&](size_t i) {
        absl::Status s = rpc_->UpdatePartition(
            tell[i].second, PartitionUpdate(w.job_id, w.recovery, tell[i].first, w.num_workers));
        if (!s.ok()) {
          Log()->warn("job {}: rank {} was not told of its new data partition: {}", w.job_id,
                      tell[i].first, s.message());
        }
      });
    }
    bool undo = false;
    {
      absl::MutexLock l(&mu_);
      JobRecord* rec = FindJob(w.job_id);
      const bool current = rec != nullptr && rec->job.state() == v1::JOB_RUNNING &&
                           static_cast<int>(w.rank) < rec->job.workers_size() &&
                           rec->job.workers(w.rank) == w.spare;
      if (!current) {
        undo = why.empty();
      } else if (!why.empty()) {
        // Some servers may have let it in already: a rollback puts every server and rank in step.
        StartRecovery(*rec, absl::StrCat("rank ", w.rank, " could not rejoin the job on ",
                                         w.spare, " (", why, ")"));
      } else {
        rejoins_->Add();
        v1::JobRecovery* r = rec->job.mutable_recovery();
        r->set_rejoins(r->rejoins() + 1);
        if (!Persist(*rec).ok()) continue;
        Log()->warn("job {}: rank {} rejoined the job on {} at step {} (it had left; an idle "
                    "worker is back)",
                    w.job_id, w.rank, w.spare, start);
      }
    }
    if (undo) (void)rpc_->StopTask(w.spare_address, w.job_id, "the job changed meanwhile");
  }
}

bool Scheduler::PromoteBackupsOf(const std::string& job_id, std::string* why) {
  v1::ShardMap map;
  v1::JobSpec spec;
  v1::JobRecovery recovery;
  std::vector<std::string> workers;
  std::string lost;
  {
    absl::MutexLock l(&mu_);
    JobRecord* rec = FindJob(job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RECOVERING) {
      *why = "the job changed meanwhile";
      return false;
    }
    map = rec->shard_map;
    spec = rec->job.spec();
    recovery = rec->job.recovery();
    workers.assign(rec->job.workers().begin(), rec->job.workers().end());
    lost = rec->promote_lost;
    rec->promote_lost.clear();  // One try; a failure rolls back.
  }
  absl::flat_hash_set<std::string> live;
  absl::flat_hash_map<std::string, std::string> address;
  for (const v1::NodeStatus& n : registry_.Snapshot()) {
    if (IsLive(n)) live.insert(n.info().node_id());
    address[n.info().node_id()] = n.info().address();
  }
  auto next = PromoteBackups(map, lost, live);
  if (!next.ok()) {
    *why = std::string(next.status().message());
    return false;
  }
  const uint32_t n = workers.size();
  for (const std::string& w : workers) {
    if (w.empty()) continue;  // A rank that left the job.
    if (!live.contains(w)) {
      *why = absl::StrCat("its worker ", w, " is not alive either");
      return false;
    }
  }
  // Each map is written before any server has it, so that no later map reuses its epoch.
  auto record = [&](const v1::ShardMap& m) -> bool {
    absl::MutexLock l(&mu_);
    JobRecord* rec = FindJob(job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RECOVERING) {
      *why = "the job changed meanwhile";
      return false;
    }
    rec->shard_map = m;
    rec->job.set_shard_map_epoch(m.epoch());
    absl::Status s = Persist(*rec, &m);
    if (!s.ok()) *why = std::string(s.message());
    return s.ok();
  };
  // 1. Every server takes the new map; a backup that becomes primary takes over its copy.
  //    Tasks of the stopped attempts are fenced off.
  if (!record(*next)) return false;
  const uint32_t attempt = NextAttempt(recovery, n);
  std::vector<absl::Status> status(next->servers_size());
  ParallelFor(next->servers_size(), [&](size_t i) {
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = *next;
    req.set_self(next->servers(i).node_id());
    req.set_min_attempt(attempt);
    status[i] = rpc_->UpdateShardMap(next->servers(i).address(), req);
  });
  for (int i = 0; i < next->servers_size(); ++i) {
    if (!status[i].ok()) {
      *why = absl::StrCat("server ", next->servers(i).node_id(), ": ", status[i].message());
      return false;
    }
  }
  // 1b. Shards that lost a copy get a new backup among the job's servers: a live copy, which
  //     its primary seeds with a snapshot taken as the map takes effect there (the tasks are
  //     stopped), ahead of every update it forwards from then on.
  if (spec.replication() > 1) {
    std::vector<std::string> candidates;
    for (const v1::ServerEndpoint& ep : next->servers()) candidates.push_back(ep.node_id());
    std::optional<v1::ShardMap> more = AddBackups(*next, spec.replication(), candidates);
    if (more.has_value()) {
      if (!record(*more)) return false;
      std::vector<absl::Status> seeded(more->servers_size());
      ParallelFor(more->servers_size(), [&](size_t i) {
        v1::UpdateShardMapRequest req;
        *req.mutable_map() = *more;
        req.set_self(more->servers(i).node_id());
        req.set_min_attempt(attempt);
        req.set_seed_new_backups(true);
        for (const std::string& p : NewlyBacked(*next, *more, more->servers(i).node_id())) {
          v1::ReplicaSeed* seed = req.add_copy_from();
          seed->set_primary(p);
          seed->set_live(true);
        }
        seeded[i] = rpc_->UpdateShardMap(more->servers(i).address(), req);
      });
      for (int i = 0; i < more->servers_size(); ++i) {
        if (!seeded[i].ok()) {
          *why = absl::StrCat("server ", more->servers(i).node_id(), " taking a new copy: ",
                              seeded[i].message());
          return false;
        }
      }
      next = std::move(*more);
      Log()->info("job {}: shards that lost a copy got a new backup (map epoch {})", job_id,
                  next->epoch());
    }
  }
  // 2. Where each rank stands: its lowest clock over the servers (a rank half-way through a
  //    step pushes that step again; what a server already has of it is a duplicate there).
  std::vector<int64_t> start(n, -1);
  for (int i = 0; i < next->servers_size(); ++i) {
    auto st = rpc_->ServerStatus(next->servers(i).address(), job_id);
    if (!st.ok() || st->jobs_size() != 1) {
      *why = absl::StrCat("server ", next->servers(i).node_id(), " reports no state of the job");
      return false;
    }
    for (const v1::WorkerClock& c : st->jobs(0).clocks()) {
      if (c.worker() < n && (start[c.worker()] < 0 || c.clock() < start[c.worker()])) {
        start[c.worker()] = c.clock();
      }
    }
  }
  v1::JobRecovery at = recovery;
  at.clear_rank_attempts();
  for (uint32_t r = 0; r < n; ++r) at.add_rank_attempts(attempt);
  // 3. Every rank's task again, on its worker, from there.
  std::vector<absl::Status> assigned(n);
  ParallelFor(n, [&](size_t r) {
    if (workers[r].empty()) return;  // Left the job.
    if (start[r] < 0) {
      assigned[r] = absl::NotFoundError(absl::StrCat("no clock of rank ", r));
      return;
    }
    v1::JobRecovery rank_at = at;
    rank_at.set_start_step(start[r]);
    assigned[r] = rpc_->AssignTask(address[workers[r]],
                                   TaskFor(job_id, spec, *next, r, n, rank_at));
  });
  for (uint32_t r = 0; r < n; ++r) {
    if (assigned[r].ok()) continue;
    *why = absl::StrCat("rank ", r, " on ", workers[r], ": ", assigned[r].message());
    ParallelFor(n, [&](size_t q) {
      if (assigned[q].ok() && !workers[q].empty()) {
        (void)rpc_->StopTask(address[workers[q]], job_id, *why);
      }
    });
    const absl::Time until = absl::Now() + options_.task_stop_grace;
    while (absl::Now() < until && WorkerStillRuns(workers, job_id)) absl::SleepFor(kStopRecheck);
    return false;
  }
  // 4. Running again.
  absl::MutexLock l(&mu_);
  JobRecord* rec = FindJob(job_id);
  if (rec == nullptr || rec->job.state() != v1::JOB_RECOVERING) {
    ParallelFor(n, [&](size_t q) {
      if (!workers[q].empty()) {
        (void)rpc_->StopTask(address[workers[q]], job_id, "the job changed meanwhile");
      }
    });
    return true;  // Cancelled meanwhile: nothing to roll back.
  }
  v1::Job& job = rec->job;
  rec->shard_map = *next;
  job.set_shard_map_epoch(next->epoch());
  job.clear_servers();
  for (const v1::ServerEndpoint& ep : next->servers()) job.add_servers(ep.node_id());
  v1::JobRecovery* r = job.mutable_recovery();
  *r->mutable_rank_attempts() = at.rank_attempts();
  r->set_promotions(r->promotions() + 1);
  r->set_recovered_unix_ms(UnixMs(clock_->Now()));
  for (uint32_t q = 0; q < n && static_cast<int>(q) < job.progress().workers_size(); ++q) {
    if (!workers[q].empty()) job.mutable_progress()->mutable_workers(q)->set_step(start[q]);
  }
  job.set_state(v1::JOB_RUNNING);
  job.set_reason(absl::StrCat("recovered with no rollback from: ", r->last_cause(),
                              "; its shards' backups took over"));
  // Not written: the store's recovery reloads the job as RECOVERING (with the promoted map's
  // epoch, written before the servers had it) and rolls it back.
  if (!Persist(*rec).ok()) return true;
  promotions_->Add();
  Log()->warn("job {}: backups of {} took over its shards (map epoch {}); every rank resumed "
              "where the servers had it, no rollback",
              job_id, lost, next->epoch());
  Wake();
  return true;
}

void Scheduler::RecoverJobs() {
  struct Work {
    std::string job_id;
    std::string cause;
    std::vector<std::string> workers, servers;
    std::string checkpoint_dir;
    uint32_t num_shards = 0;
    uint64_t epoch = 0;
    google::protobuf::RepeatedPtrField<v1::Rollback> rollbacks;
  };
  std::vector<Work> work;
  {
    absl::MutexLock l(&mu_);
    for (const std::string& id : order_) {
      const JobRecord& rec = jobs_[id];
      const v1::Job& job = rec.job;
      if (job.state() != v1::JOB_RECOVERING) continue;
      Work w;
      w.job_id = id;
      w.cause = job.recovery().last_cause();
      w.workers.assign(job.workers().begin(), job.workers().end());
      w.servers.assign(job.servers().begin(), job.servers().end());
      w.checkpoint_dir = job.spec().checkpoint_dir();
      w.num_shards = rec.shard_map.num_virtual_shards();
      w.epoch = rec.shard_map.epoch();
      w.rollbacks = job.recovery().rollbacks();
      work.push_back(std::move(w));
    }
  }
  for (const Work& w : work) {
    // 1. Its tasks stop (and are waited for: a task still running would push into the restored
    //    tables), 2. its servers forget it, 3. the newest complete checkpoint is found.
    const std::string why = absl::StrCat("recovering: ", w.cause);
    ParallelFor(w.workers.size(), [&](size_t i) {
      auto node = registry_.Get(w.workers[i]);
      if (!node.has_value() || !IsLive(*node)) return;
      absl::Status s = rpc_->StopTask(node->info().address(), w.job_id, why);
      if (!s.ok()) Log()->warn("job {}: stopping the task on {}: {}", w.job_id, w.workers[i], s);
    });
    const absl::Time until = absl::Now() + options_.task_stop_grace;
    while (absl::Now() < until && WorkerStillRuns(w.workers, w.job_id)) {
      absl::SleepFor(kStopRecheck);
    }
    {
      bool promote = false;
      {
        absl::MutexLock l(&mu_);
        JobRecord* rec = FindJob(w.job_id);
        promote = rec != nullptr && rec->job.state() == v1::JOB_RECOVERING &&
                  !rec->promote_lost.empty();
      }
      std::string why;
      if (promote && !WorkerStillRuns(w.workers, w.job_id)) {
        if (PromoteBackupsOf(w.job_id, &why)) continue;
        if (!store_status().ok()) return;  // Nothing more until the store works again.
        Log()->warn("job {}: its backups cannot take over ({}); rolling back", w.job_id, why);
      }
    }
    ParallelFor(w.servers.size(), [&](size_t i) {
      auto node = registry_.Get(w.servers[i]);
      if (!node.has_value() || !IsLive(*node)) return;
      absl::Status s = rpc_->DropJob(node->info().address(), w.job_id);
      if (!s.ok()) Log()->warn("job {}: dropping it on {}: {}", w.job_id, w.servers[i], s);
    });
    auto point = FindRecoveryPoint(w.checkpoint_dir, w.job_id, w.num_shards, w.rollbacks);
    if (point.ok()) {
      for (const std::string& skipped : point->skipped) {
        Log()->warn("job {}: checkpoint not restored: {}", w.job_id, skipped);
      }
    }

    absl::MutexLock l(&mu_);
    JobRecord* rec = FindJob(w.job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RECOVERING) continue;  // Cancelled.
    v1::Job& job = rec->job;
    if (!point.ok()) {
      Finish(*rec, v1::JOB_FAILED,
             absl::StrCat(w.cause, "; cannot recover: ", point.status().message()));
      continue;
    }
    v1::JobRecovery* r = job.mutable_recovery();
    // Every task of the new placement runs one new attempt, above all earlier ones.
    const uint32_t attempt = NextAttempt(*r, job.spec().num_workers());
    r->set_recoveries(r->recoveries() + 1);
    r->clear_rank_attempts();
    for (uint32_t i = 0; i < std::max<uint32_t>(1, job.spec().num_workers()); ++i) {
      r->add_rank_attempts(attempt);
    }
    r->set_start_step(point->step);
    r->clear_left();  // Placed again with all its ranks.
    // Possibly on other workers: equal parts until their rates are measured again.
    r->clear_data_shares();
    r->set_balanced_unix_ms(0);
    rec->shares_unsent.clear();
    r->clear_cut_backups();  // Placed again: every server starts afresh.
    r->clear_restore_from();
    for (v1::RestoreFile& f : point->files) *r->add_restore_from() = std::move(f);
    v1::Rollback* rb = r->add_rollbacks();
    rb->set_epoch(w.epoch + 1);  // The next placement's epoch.
    rb->set_step(point->step);
    r->set_recovered_unix_ms(UnixMs(clock_->Now()));
    job.mutable_progress()->set_rolled_back_to_step(point->step);
    std::string from =
        !point->files.empty()
            ? absl::StrCat(r->restore_from_size(), " checkpoint file(s) in ", point->dir)
        : w.checkpoint_dir.empty()
            ? std::string("the job has no checkpoint_dir: from the start")
            : absl::StrCat("no complete checkpoint in ", point->dir, ": from the start");
    job.set_state(v1::JOB_QUEUED);
    job.set_reason(absl::StrCat("recovered (", r->recoveries(), " of at most ",
                                options_.max_recoveries, ") from: ", w.cause,
                                "; rolled back to step ", point->step, " (", from, ")"));
    job.clear_servers();
    job.clear_workers();
    rec->placement_attempts = 0;
    rec->next_attempt = absl::InfinitePast();
    if (!Persist(*rec).ok()) continue;
    recoveries_->Add();
    Log()->warn("job {}: {}", w.job_id, job.reason());
    Wake();
  }
}

std::vector<Scheduler::PlacementWork> Scheduler::PlaceQueuedJobs() {
  {
    // Most passes have nothing to place: skip the registry snapshot then.
    absl::MutexLock l(&mu_);
    bool any = false;
    for (const auto& [id, rec] : jobs_) {
      any = any || rec.job.state() == v1::JOB_QUEUED || rec.placement_pending;
    }
    if (!any) return {};
  }
  std::vector<v1::NodeStatus> nodes = registry_.Snapshot();
  absl::Time now = clock_->Now();
  absl::MutexLock l(&mu_);
  std::vector<PlacementWork> work;

  // What running jobs hold now.
  absl::flat_hash_set<std::string> busy;
  absl::flat_hash_map<std::string, uint32_t> hosted;
  for (const auto& [id, rec] : jobs_) {
    if (!HoldsResources(rec.job.state())) continue;
    for (const std::string& w : rec.job.workers()) busy.insert(w);
    for (const v1::ShardAssignment& a : rec.shard_map.assignments()) ++hosted[a.primary()];
  }
  absl::flat_hash_map<std::string, std::string> address;
  std::vector<ServerCandidate> servers;
  std::vector<WorkerCandidate> workers;
  for (const v1::NodeStatus& n : nodes) {
    address[n.info().node_id()] = n.info().address();
    if (n.state() != v1::NODE_ALIVE) continue;  // No new work on suspect or dead nodes.
    const v1::Resources& cap = n.info().capacity();
    if (n.info().role() == v1::ROLE_SERVER) {
      ServerCandidate c;
      c.node_id = n.info().node_id();
      c.address = n.info().address();
      c.memory_bytes = cap.memory_bytes();
      c.memory_used_bytes = n.load().memory_used_bytes();
      c.bytes_per_sec = n.load().bytes_per_sec();
      c.shards_hosted = hosted[c.node_id];
      servers.push_back(std::move(c));
    } else if (!busy.contains(n.info().node_id())) {
      WorkerCandidate c;
      c.node_id = n.info().node_id();
      c.address = n.info().address();
      c.gpus = cap.gpus();
      // A worker that declares nothing can still run one CPU task.
      c.cpu_slots = (cap.cpu_slots() == 0 && cap.gpus() == 0) ? 1 : cap.cpu_slots();
      workers.push_back(std::move(c));
    }
  }

  for (const std::string& id : order_) {
    JobRecord& rec = jobs_[id];
    v1::Job& job = rec.job;
    if (job.state() == v1::JOB_PLACING && rec.placement_pending) {
      // Restored mid-placement: make the same calls again (they are idempotent).
      PlacementWork w{id, job.spec(), rec.shard_map, {job.workers().begin(), job.workers().end()},
                      job.recovery()};
      rec.placement_pending = false;
      work.push_back(std::move(w));
      continue;
    }
    if (job.state() != v1::JOB_QUEUED || now < rec.next_attempt) continue;
    PlacementRequest req;
    req.job_id = id;
    req.num_servers = job.spec().num_servers();
    req.num_workers = job.spec().num_workers();
    req.gpus_per_worker = job.spec().gpus_per_worker();
    req.num_virtual_shards = job.spec().num_virtual_shards();
    req.replication = job.spec().replication();
    auto placed = placement_->Place(req, servers, workers);
    if (!placed.ok()) {
      if (placed.status().code() == absl::StatusCode::kResourceExhausted) {
        std::string reason = absl::StrCat("waiting for resources: ", placed.status().message());
        if (job.reason() != reason && job.reason().rfind("placement failed", 0) != 0) {
          job.set_reason(reason);
          if (!Persist(rec).ok()) break;
        }
      } else {
        Finish(rec, v1::JOB_FAILED, absl::StrCat("cannot be placed: ", placed.status().message()));
      }
      continue;
    }
    job.set_state(v1::JOB_PLACING);
    job.clear_reason();
    job.clear_servers();
    job.clear_workers();
    for (const std::string& s : placed->servers) job.add_servers(s);
    for (const std::string& w : placed->workers) job.add_workers(w);
    uint64_t epoch = std::max<uint64_t>(1, rec.shard_map.epoch() + 1);
    placed->shard_map.set_epoch(epoch);
    job.set_shard_map_epoch(epoch);
    int64_t rolled_back = job.progress().rolled_back_to_step();
    *job.mutable_progress() = InitialProgress(placed->workers);
    job.mutable_progress()->set_rolled_back_to_step(rolled_back);
    rec.shard_map = placed->shard_map;
    rec.server_waiting_for.clear();
    if (!Persist(rec, &rec.shard_map).ok()) break;  // Not written: not sent either.
    Log()->info("job {} placed: shard map epoch {}, servers [{}], workers [{}]", id, epoch,
                absl::StrJoin(placed->servers, ", "), absl::StrJoin(placed->workers, ", "));
    // What this job takes is gone for the next ones.
    absl::flat_hash_set<std::string> taken(placed->workers.begin(), placed->workers.end());
    workers.erase(std::remove_if(workers.begin(), workers.end(),
                                 [&](const WorkerCandidate& c) { return taken.contains(c.node_id); }),
                  workers.end());
    absl::flat_hash_map<std::string, uint32_t> added;
    for (const v1::ShardAssignment& a : rec.shard_map.assignments()) ++added[a.primary()];
    for (ServerCandidate& c : servers) c.shards_hosted += added[c.node_id];
    work.push_back(PlacementWork{id, job.spec(), rec.shard_map, placed->workers, job.recovery()});
  }
  return work;
}

bool Scheduler::WaitForStoppingWorkers(const PlacementWork& w) {
  const uint32_t n = w.workers.size();
  std::vector<std::string> busy_with(n);
  ParallelFor(n, [&](size_t rank) {
    auto status = registry_.Get(w.workers[rank]);
    if (!status.has_value()) return;
    auto ws = rpc_->WorkerStatus(status->info().address());
    if (ws.ok() && ws->busy() && ws->job_id() != w.job_id) busy_with[rank] = ws->job_id();
  });
  absl::MutexLock l(&mu_);
  std::vector<std::string> stopping;
  for (uint32_t rank = 0; rank < n; ++rank) {
    if (busy_with[rank].empty()) continue;
    const JobRecord* other = FindJob(busy_with[rank]);
    // Only a job this scheduler has ended: its task is on its way out. Anything else is a real
    // conflict, which AssignTask reports.
    if (other == nullptr || !IsTerminal(other->job.state())) continue;
    stopping.push_back(absl::StrCat(w.workers[rank], " (", busy_with[rank], ")"));
  }
  if (stopping.empty()) return false;
  JobRecord* rec = FindJob(w.job_id);
  if (rec == nullptr || rec->job.state() != v1::JOB_PLACING) return true;
  // Nothing was called yet: back to the queue, the attempt not counted.
  v1::Job& job = rec->job;
  std::string reason = absl::StrCat(
      "waiting for resources: ", stopping.size() == 1 ? "worker " : "workers ",
      absl::StrJoin(stopping, ", "), " still stopping the task of a job that ended");
  if (reason != job.reason()) Log()->info("job {}: {}", w.job_id, reason);
  job.set_state(v1::JOB_QUEUED);
  job.set_reason(reason);
  job.clear_servers();
  job.clear_workers();
  rec->next_attempt = clock_->Now() + kStoppingRetry;
  // Nothing is called either way; a failed write is the sticky store error (logged).
  if (!Persist(*rec).ok()) return true;
  return true;
}

void Scheduler::ExecutePlacement(const PlacementWork& w) {
  // Workers still finishing the task of a job that ended (cancelled, or its final report just
  // in) would refuse the task: wait for them instead of failing an attempt.
  if (WaitForStoppingWorkers(w)) return;
  const uint32_t n = w.workers.size();
  std::vector<std::string> reached_servers, reached_workers;
  // First every server learns the map (all in parallel), then every worker gets its task.
  const int num_servers = w.map.servers_size();
  std::vector<absl::Status> server_status(num_servers);
  ParallelFor(num_servers, [&](size_t i) {
    const v1::ServerEndpoint& ep = w.map.servers(i);
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = w.map;
    req.set_self(ep.node_id());
    // Tasks of an earlier placement (paused, or cut off from the scheduler) are refused.
    req.set_min_attempt(RankAttempt(w.recovery, 0));
    if (w.recovery.recoveries() > 0) {
      // After a rollback: this server's shards come from the checkpoint files, its clocks from
      // the step the workers resume at.
      for (std::string& f : RestoreFilesFor(w.recovery.restore_from(), w.map, ep.node_id())) {
        req.add_restore_from(std::move(f));
      }
      req.set_restore_step(w.recovery.start_step());
    }
    absl::Status s = rpc_->UpdateShardMap(ep.address(), req);
    if (!s.ok()) {
      s = absl::Status(s.code(), absl::StrCat("server ", ep.node_id(), ": ", s.message()));
    }
    server_status[i] = s;
  });
  absl::Status failure;
  for (int i = 0; i < num_servers; ++i) {
    reached_servers.push_back(w.map.servers(i).node_id());
    if (failure.ok() && !server_status[i].ok()) failure = server_status[i];
  }
  if (failure.ok()) {
    std::vector<absl::Status> worker_status(n);
    ParallelFor(n, [&](size_t rank) {
      const std::string& node = w.workers[rank];
      auto status = registry_.Get(node);
      if (!status.has_value() || !IsLive(*status)) {
        worker_status[rank] =
            absl::UnavailableError(absl::StrCat("worker ", node, " is no longer alive"));
        return;
      }
      const std::string& addr = status->info().address();
      v1::AssignTaskRequest req = TaskFor(w.job_id, w.spec, w.map, rank, n, w.recovery);
      absl::Status s = rpc_->AssignTask(addr, req);
      if (s.code() == absl::StatusCode::kFailedPrecondition) {
        // Busy: fine if it already runs this very task (we restarted mid-placement).
        auto ws = rpc_->WorkerStatus(addr);
        if (ws.ok() && ws->busy() && ws->job_id() == w.job_id && ws->rank() == rank &&
            ws->attempt() == RankAttempt(w.recovery, rank)) {
          s = absl::OkStatus();
        }
      }
      if (!s.ok()) s = absl::Status(s.code(), absl::StrCat("worker ", node, ": ", s.message()));
      worker_status[rank] = s;
    });
    for (uint32_t rank = 0; rank < n; ++rank) {
      reached_workers.push_back(w.workers[rank]);
      if (failure.ok() && !worker_status[rank].ok()) failure = worker_status[rank];
    }
  }

  bool roll_back = false;
  std::string why;
  {
    absl::MutexLock l(&mu_);
    JobRecord* rec = FindJob(w.job_id);
    if (rec == nullptr) return;
    v1::Job& job = rec->job;
    if (job.state() != v1::JOB_PLACING) {
      // Cancelled or re-queued while we placed it.
      roll_back = true;
      why = job.reason();
    } else if (failure.ok()) {
      job.set_state(v1::JOB_RUNNING);
      job.set_started_unix_ms(UnixMs(clock_->Now()));
      job.clear_reason();
      rec->placement_attempts = 0;
      // Not written: the store's recovery reloads it as PLACING and places it again.
      if (!Persist(*rec).ok()) return;
      Log()->info("job {} running", w.job_id);
      MaybeSucceed(*rec);
    } else {
      ++rec->placement_attempts;
      Log()->warn("job {}: placement attempt {} failed: {}", w.job_id, rec->placement_attempts,
                  failure);
      why = absl::StrCat("placement failed: ", failure.message());
      roll_back = true;
      if (rec->placement_attempts >= options_.max_placement_attempts) {
        // Finish() queues StopTask / DropJob for every node of the job.
        roll_back = false;
        Finish(*rec, v1::JOB_FAILED,
               absl::StrCat(why, " (gave up after ", rec->placement_attempts, " attempts)"));
      } else {
        job.set_state(v1::JOB_QUEUED);
        job.set_reason(absl::StrCat(why, " (attempt ", rec->placement_attempts, " of ",
                                    options_.max_placement_attempts, "; retrying)"));
        job.clear_servers();
        job.clear_workers();
        rec->next_attempt = clock_->Now() + options_.placement_backoff;
        if (!Persist(*rec).ok()) return;  // Not written: nothing rolled back either.
      }
    }
  }
  if (roll_back) RollBack(w.job_id, reached_servers, reached_workers, why);
}

void Scheduler::RollBack(const std::string& job_id, const std::vector<std::string>& servers,
                         const std::vector<std::string>& workers, const std::string& reason) {
  for (const std::string& node : workers) {
    auto st = registry_.Get(node);
    if (!st.has_value() || !IsLive(*st)) continue;
    absl::Status s = rpc_->StopTask(st->info().address(), job_id, reason);
    if (!s.ok()) Log()->warn("job {}: undoing the task on {}: {}", job_id, node, s);
  }
  for (const std::string& node : servers) {
    auto st = registry_.Get(node);
    if (!st.has_value() || !IsLive(*st)) continue;
    absl::Status s = rpc_->DropJob(st->info().address(), job_id);
    if (!s.ok()) Log()->warn("job {}: dropping it on {}: {}", job_id, node, s);
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
    for (const std::string& id : order_) {
      JobRecord& rec = jobs_[id];
      if (rec.job.state() != v1::JOB_RUNNING) continue;
      // Who is waited for (BSP, SSP); whether primaries reach their backups (replicas).
      if (rec.job.spec().consistency().mode() == v1::ConsistencySpec::ASP &&
          rec.job.spec().replication() <= 1) {
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
      // A job placed again since holds these nodes anew: leave them alone.
      if (rec != nullptr && HoldsResources(rec->job.state()) &&
          (!c.stale_copy || std::find(rec->job.servers().begin(), rec->job.servers().end(),
                                      c.node_id) != rec->job.servers().end())) {
        continue;
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
    if (++c.attempts >= kMaxCleanupAttempts) {
      Log()->warn("job {}: giving up on {} at {}: {}", c.job_id,
                  c.drop_job ? "DropJob" : "StopTask", c.node_id, s);
      return;
    }
    c.not_before = now + kCleanupRetry;
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
