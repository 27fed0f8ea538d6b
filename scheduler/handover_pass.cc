// The hand-over pass: a lost worker's rank goes to an idle live worker at the slowest of its
// clocks on the servers, or leaves the job (its data adopted by another rank), or the job rolls
// back when neither can be done.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "scheduler/job_state.h"
#include "scheduler/membership.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"
#include "scheduler/progress.h"

namespace pscluster::scheduler {
namespace {

class HandOverPass final : public Pass {
 public:
  explicit HandOverPass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "hand_over"; }
  // Gives the lost ranks of running jobs to idle workers (or lets them leave the job, or starts
  // a rollback recovery).
  void Run() override;

 private:
  // A rank to hand over or to finish leaving, planned under the lock, carried out outside it.
  struct RankWork {
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
  using NodeIndex = absl::flat_hash_map<std::string, const v1::NodeStatus*>;

  // Whether some running job has a lost rank, an unfinished leaving or a dead worker.
  bool AnyRankToHandOver();
  // Chooses an idle worker per lost rank and assigns the rank to it in the job (persisted), or
  // records that the rank leaves; returns what to tell the nodes.
  std::vector<RankWork> PlanHandOversLocked(const std::vector<v1::NodeStatus>& nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu());
  // An idle live worker of `nodes` (not in `busy`) that can run the job's task; `old`, the one
  // that ran it, only when no other is idle if `avoid_old`, else first. Empty: none.
  static std::string IdleWorkerFor(const v1::JobSpec& spec, const std::string& old, bool avoid_old,
                                   const std::vector<v1::NodeStatus>& nodes,
                                   const absl::flat_hash_set<std::string>& busy);
  // Records that `rank` of `rec` leaves the job (persisted); the live rank still training that
  // reads the fewest parts takes its data, and the data of the ranks it had taken over. nullopt:
  // it may not (fewer than spec.min_workers live ranks would remain) or the write failed.
  std::optional<RankWork> LeaveRankLocked(JobRecord& rec, uint32_t rank, const std::string& cause,
                                          const NodeIndex& by_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu());
  static RankWork RankWorkOf(const JobRecord& rec, uint32_t rank, const std::string& cause,
                             const std::string& lost);
  // Fences the rank on every server, starts its task on the spare at its slowest clock, and
  // records the hand-over (or starts a rollback recovery naming what failed).
  void CarryOutHandOver(const RankWork& work);
  // After PlanHandOversLocked recorded that `rank` left the job: every server takes it out of
  // the barrier, and the rank that takes its data (`adopter`; `rank` itself when none) and, if
  // the lead rank changed, every remaining rank get their new partition. A server that cannot be
  // told makes the job roll back instead.
  void FinishLeaving(const std::string& job_id, uint32_t rank, const std::string& cause,
                     const std::string& lost, const v1::ShardMap& map, uint32_t num_workers,
                     const v1::JobRecovery& recovery, uint32_t adopter,
                     const std::string& adopter_address);

  SchedulerCore& core_;
};

}  // namespace

bool HandOverPass::AnyRankToHandOver() {
  absl::MutexLock l(&core_.mu());
  for (const JobRecord& rec : core_.jobs()) {
    if (!rec.lost_ranks.empty()) return true;
    if (rec.job.state() != v1::JOB_RUNNING) continue;
    // A rank whose leaving did not finish (the scheduler stopped half-way).
    for (const v1::LeftRank& left : rec.job.recovery().left()) {
      if (left.step() < 0) return true;
    }
    // Workers of running jobs found dead without an event (after a scheduler restart).
    for (const std::string& w : rec.job.workers()) {
      auto n = core_.registry().Get(w);
      if (n.has_value() && !IsLive(*n)) return true;
    }
  }
  return false;
}

void HandOverPass::Run() {
  if (!AnyRankToHandOver()) return;
  const std::vector<v1::NodeStatus> nodes = core_.registry().Snapshot();
  std::vector<RankWork> work;
  {
    absl::MutexLock l(&core_.mu());
    work = PlanHandOversLocked(nodes);
  }
  for (RankWork& w : work) {
    if (w.leave) {
      FinishLeaving(w.job_id, w.rank, w.cause, w.lost, w.map, w.num_workers, w.recovery, w.adopter,
                    w.adopter_address);
    } else {
      CarryOutHandOver(w);
    }
  }
}

HandOverPass::RankWork HandOverPass::RankWorkOf(const JobRecord& rec, uint32_t rank,
                                                const std::string& cause, const std::string& lost) {
  RankWork w;
  w.job_id = rec.job.job_id();
  w.rank = rank;
  w.cause = cause;
  w.lost = lost;
  w.spec = rec.job.spec();
  w.map = rec.shard_map;
  w.num_workers = rec.job.workers_size();
  w.recovery = rec.job.recovery();
  return w;
}

std::vector<HandOverPass::RankWork> HandOverPass::PlanHandOversLocked(
    const std::vector<v1::NodeStatus>& nodes) {
  NodeIndex by_id;
  for (const v1::NodeStatus& n : nodes) by_id[n.info().node_id()] = &n;
  absl::flat_hash_set<std::string> busy;
  for (const JobRecord& rec : core_.jobs()) {
    if (!HoldsResources(rec.job.state())) continue;
    for (const std::string& w : rec.job.workers()) busy.insert(w);
  }
  std::vector<RankWork> work;
  for (JobRecord& rec : core_.jobs()) {
    v1::Job& job = rec.job;
    if (job.state() != v1::JOB_RUNNING) {
      rec.lost_ranks.clear();
      continue;
    }
    // Leavings recorded but not finished (every leaving finishes, or rolls the job back, within
    // the pass that records it): the scheduler stopped half-way. Again, with the same adopter; a
    // server that has already taken the rank out answers the same.
    for (const v1::LeftRank& left : job.recovery().left()) {
      if (left.step() >= 0) continue;
      RankWork w = RankWorkOf(rec, left.rank(), left.cause(), left.node_id());
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
      std::string reason = absl::StrCat("worker of rank ", r, " ", core_.Describe(job.workers(r)),
                                        " is no longer alive");
      if (!core_.MayRecover(rec, reason)) break;
      rec.lost_ranks.push_back({static_cast<uint32_t>(r), reason});
    }
    if (job.state() != v1::JOB_RUNNING || rec.lost_ranks.empty()) continue;
    std::vector<JobRecord::LostRank> lost;
    lost.swap(rec.lost_ranks);
    for (const JobRecord::LostRank& lr : lost) {
      const uint32_t rank = lr.rank;
      const std::string old = job.workers(rank);
      const std::string spare = IdleWorkerFor(job.spec(), old, lr.avoid_node, nodes, busy);
      if (spare.empty()) {
        // No idle worker: the rank leaves the job when enough others train on (one of them
        // reads its data from then on); otherwise the job rolls back and waits for workers.
        std::optional<RankWork> leave = LeaveRankLocked(rec, rank, lr.cause, by_id);
        if (!leave.has_value()) {
          core_.StartRecovery(rec, absl::StrCat(lr.cause, "; no idle worker to take its rank"));
          break;
        }
        work.push_back(std::move(*leave));
        continue;
      }
      // Assigned in the job now, so that the new task's first progress report is accepted; its
      // attempt is above every earlier one, so that the servers can fence the old task off.
      busy.insert(spare);
      job.set_workers(rank, spare);
      StartNewAttempt(job.mutable_recovery(), rank, job.workers_size());
      if (static_cast<int>(rank) < job.progress().workers_size()) {
        v1::WorkerProgress* p = job.mutable_progress()->mutable_workers(rank);
        p->set_node_id(spare);
        p->set_done(false);
        p->clear_error();
      }
      if (!core_.jobs().Persist(rec).ok()) break;  // Not written: not sent either.
      RankWork w = RankWorkOf(rec, rank, lr.cause, old);
      w.spare = spare;
      w.spare_address = by_id[spare]->info().address();
      work.push_back(std::move(w));
    }
  }
  return work;
}

std::string HandOverPass::IdleWorkerFor(const v1::JobSpec& spec, const std::string& old,
                                        bool avoid_old, const std::vector<v1::NodeStatus>& nodes,
                                        const absl::flat_hash_set<std::string>& busy) {
  // An idle live worker able to run the task; a restarted one may take its rank back. A worker
  // whose task failed for a reason another may not meet gets it back only when no other worker
  // is idle.
  std::string same, other;
  for (const v1::NodeStatus& n : nodes) {
    const std::string& nid = n.info().node_id();
    if (n.info().role() != v1::ROLE_WORKER || n.state() != v1::NODE_ALIVE) continue;
    if (busy.contains(nid) && nid != old) continue;
    if (!WorkerFitsJob(n.info(), spec)) continue;
    if (nid == old) {
      same = nid;
    } else if (other.empty()) {
      other = nid;
    }
  }
  return avoid_old ? (other.empty() ? same : other) : (same.empty() ? other : same);
}

std::optional<HandOverPass::RankWork> HandOverPass::LeaveRankLocked(JobRecord& rec, uint32_t rank,
                                                                    const std::string& cause,
                                                                    const NodeIndex& by_id) {
  v1::Job& job = rec.job;
  const uint32_t n = job.workers_size();
  v1::JobRecovery* rr = job.mutable_recovery();
  // The live rank still training that reads the fewest parts takes the data.
  uint32_t remaining = 0;
  std::optional<uint32_t> adopter;
  size_t adopter_parts = 0;
  for (uint32_t q = 0; q < n; ++q) {
    if (q == rank || job.workers(q).empty()) continue;
    auto it = by_id.find(job.workers(q));
    if (it == by_id.end() || !IsLive(*it->second)) continue;
    ++remaining;
    if (static_cast<int>(q) < job.progress().workers_size() && job.progress().workers(q).done()) {
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
  left->set_unix_ms(UnixMs(core_.clock().Now()));
  // Its attempt moves on: reports of a task of it still running (a worker cut off) are ignored,
  // and the servers refuse every attempt of it once it has left.
  StartNewAttempt(rr, rank, n);
  job.set_workers(rank, "");  // No node runs it any more.
  if (static_cast<int>(rank) < job.progress().workers_size()) {
    v1::WorkerProgress* p = job.mutable_progress()->mutable_workers(rank);
    p->set_left(true);
    p->set_done(true);
    p->set_samples_per_sec(0);
    p->clear_error();
  }
  Summarize(job.spec(), rec.server_waiting_for, job.mutable_progress());
  if (!core_.jobs().Persist(rec).ok()) return std::nullopt;  // Not written: not sent either.
  RankWork w = RankWorkOf(rec, rank, cause, old);
  w.leave = true;
  w.adopter = takes;
  if (adopter.has_value()) {
    w.adopter_address = by_id.at(job.workers(*adopter))->info().address();
  }
  return w;
}

void HandOverPass::CarryOutHandOver(const RankWork& w) {
  // Every server fences the rank at the new task's attempt first: the old task, should it still
  // run (paused, or cut off from the scheduler only), is refused from then on and cannot advance
  // the rank's clock. The new worker resumes the rank at its slowest clock on the servers: each
  // server's exactly-once tags drop the part of that step the old task had already pushed there.
  std::string why;
  std::vector<int64_t> clocks = ClockOnEveryServer(
      w.map,
      [&](const v1::ServerEndpoint& ep) {
        return core_.rpc().FenceWorker(ep.address(), w.job_id, w.rank,
                                       RankAttempt(w.recovery, w.rank));
      },
      &why);
  int64_t start = clocks.empty() ? 0 : *std::min_element(clocks.begin(), clocks.end());
  if (why.empty()) {
    v1::JobRecovery at = w.recovery;
    at.set_start_step(start);
    absl::Status s = core_.rpc().AssignTask(
        w.spare_address, TaskFor(w.job_id, w.spec, w.map, w.rank, w.num_workers, at));
    if (!s.ok()) why = absl::StrCat("worker ", w.spare, ": ", s.message());
  }
  bool undo = false;
  {
    absl::MutexLock l(&core_.mu());
    JobRecord* rec = core_.jobs().Find(w.job_id);
    const bool current = rec != nullptr && rec->job.state() == v1::JOB_RUNNING &&
                         static_cast<int>(w.rank) < rec->job.workers_size() &&
                         rec->job.workers(w.rank) == w.spare;
    if (!current) {
      // Cancelled or recovering from another loss meanwhile: the new task must not run on.
      undo = why.empty();
    } else if (!why.empty()) {
      core_.StartRecovery(*rec,
                          absl::StrCat(w.cause, "; its rank could not be handed over (", why, ")"));
    } else {
      v1::JobRecovery* r = rec->job.mutable_recovery();
      r->set_handovers(r->handovers() + 1);
      r->set_last_cause(w.cause);
      r->set_recovered_unix_ms(UnixMs(core_.clock().Now()));
      if (!core_.jobs().Persist(*rec).ok()) return;
      core_.counters().handovers->Add();
      Log()->warn(
          "job {}: rank {} handed over from {} to {}, resuming at step {} with no "
          "rollback: {}",
          w.job_id, w.rank, w.lost, w.spare, start, w.cause);
    }
  }
  if (undo) (void)core_.rpc().StopTask(w.spare_address, w.job_id, "the job changed meanwhile");
}

void HandOverPass::FinishLeaving(const std::string& job_id, uint32_t rank, const std::string& cause,
                                 const std::string& lost, const v1::ShardMap& map,
                                 uint32_t num_workers, const v1::JobRecovery& recovery,
                                 uint32_t adopter, const std::string& adopter_address) {
  // 1. Every server takes the rank out of the job's barrier (and refuses it from then on).
  std::string why;
  std::vector<int64_t> clocks = ClockOnEveryServer(
      map,
      [&](const v1::ServerEndpoint& ep) {
        return core_.rpc().LeaveJob(ep.address(), job_id, rank);
      },
      &why);
  // 2. The rank that takes its data reads it from its next batch on (and every remaining rank
  //    learns the lead rank, which changes when rank 0 leaves).
  std::string adopted = "nobody (every other rank had finished)";
  if (why.empty()) {
    std::vector<std::pair<uint32_t, std::string>> remaining;
    bool aggregate = false;
    {
      absl::MutexLock l(&core_.mu());
      JobRecord* rec = core_.jobs().Find(job_id);
      if (rec != nullptr) {
        aggregate = rec->job.spec().consistency().aggregate();
        for (int q = 0; q < rec->job.workers_size(); ++q) {
          if (rec->job.workers(q).empty()) continue;
          auto node = core_.registry().Get(rec->job.workers(q));
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
      updated[i] = core_.rpc().UpdatePartition(q == adopter ? adopter_address : remaining[i].second,
                                               PartitionUpdate(job_id, recovery, q, num_workers));
    });
    for (size_t i = 0; i < remaining.size(); ++i) {
      if (updated[i].ok()) continue;
      Log()->warn("job {}: rank {} was not told of its new data partition: {}", job_id,
                  remaining[i].first, updated[i].message());
    }
    if (adopter != rank) adopted = absl::StrCat("rank ", adopter);
  }
  absl::MutexLock l(&core_.mu());
  JobRecord* rec = core_.jobs().Find(job_id);
  if (rec == nullptr || rec->job.state() != v1::JOB_RUNNING) return;  // Changed meanwhile.
  v1::Job& job = rec->job;
  if (!why.empty()) {
    core_.StartRecovery(*rec,
                        absl::StrCat(cause, "; its rank could not leave the job (", why, ")"));
    return;
  }
  v1::JobRecovery* r = job.mutable_recovery();
  int64_t step = clocks.empty() ? 0 : *std::min_element(clocks.begin(), clocks.end());
  for (v1::LeftRank& left : *r->mutable_left()) {
    if (left.rank() == rank) left.set_step(step);
  }
  r->set_last_cause(cause);
  r->set_recovered_unix_ms(UnixMs(core_.clock().Now()));
  if (!core_.jobs().Persist(*rec).ok()) return;
  core_.counters().leaves->Add();
  uint32_t training = 0;
  for (const std::string& w : job.workers()) training += w.empty() ? 0 : 1;
  Log()->warn(
      "job {}: rank {} (worker {}) left the job at step {} ({}; no idle worker to take "
      "it): {} reads its data from now on, {} of {} ranks train on with no rollback",
      job_id, rank, lost, step, cause, adopted, training, num_workers);
  core_.MaybeSucceed(*rec);
  core_.Wake();
}

std::unique_ptr<Pass> MakeHandOverPass(SchedulerCore& core) {
  return std::make_unique<HandOverPass>(core);
}

}  // namespace pscluster::scheduler
