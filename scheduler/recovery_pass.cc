// The recovery pass: RECOVERING jobs have their tasks stopped, then their lost server's backups
// promoted (replication > 1: no rollback), or the job dropped and rolled back to its newest
// complete checkpoint and queued again for the placement pass.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "scheduler/membership.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"
#include "scheduler/recovery.h"

namespace pscluster::scheduler {
namespace {

class RecoveryPass final : public Pass {
 public:
  explicit RecoveryPass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "recover"; }
  void Run() override;

 private:
  // After the tasks stopped: the new map to every server (promoted copies take over), and every
  // rank's task again, on its worker, at its lowest clock on the servers. On success the job
  // runs again; false (and the reason in *why) when the job must roll back instead.
  bool PromoteBackupsOf(const std::string& job_id, std::string* why);

  SchedulerCore& core_;
};

}  // namespace

void RecoveryPass::Run() {
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
    absl::MutexLock l(&core_.mu());
    for (const JobRecord& rec : core_.jobs()) {
      const std::string& id = rec.job.job_id();
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
      auto node = core_.registry().Get(w.workers[i]);
      if (!node.has_value() || !IsLive(*node)) return;
      absl::Status s = core_.rpc().StopTask(node->info().address(), w.job_id, why);
      if (!s.ok()) Log()->warn("job {}: stopping the task on {}: {}", w.job_id, w.workers[i], s);
    });
    const absl::Time until = core_.clock().Now() + core_.options().task_stop_grace;
    while (core_.clock().Now() < until && core_.WorkerStillRuns(w.workers, w.job_id)) {
      core_.clock().SleepFor(kStopRecheck);
    }
    {
      bool promote = false;
      {
        absl::MutexLock l(&core_.mu());
        JobRecord* rec = core_.jobs().Find(w.job_id);
        promote =
            rec != nullptr && rec->job.state() == v1::JOB_RECOVERING && !rec->promote_lost.empty();
      }
      std::string why;
      if (promote && !core_.WorkerStillRuns(w.workers, w.job_id)) {
        if (PromoteBackupsOf(w.job_id, &why)) continue;
        if (!core_.store_status().ok()) return;  // Nothing more until the store works again.
        Log()->warn("job {}: its backups cannot take over ({}); rolling back", w.job_id, why);
      }
    }
    ParallelFor(w.servers.size(), [&](size_t i) {
      auto node = core_.registry().Get(w.servers[i]);
      if (!node.has_value() || !IsLive(*node)) return;
      absl::Status s = core_.rpc().DropJob(node->info().address(), w.job_id);
      if (!s.ok()) Log()->warn("job {}: dropping it on {}: {}", w.job_id, w.servers[i], s);
    });
    auto point = FindRecoveryPoint(w.checkpoint_dir, w.job_id, w.num_shards, w.rollbacks,
                                   core_.options().checkpoint_root, core_.options().checkpoint_fs);
    if (point.ok()) {
      for (const std::string& skipped : point->skipped) {
        Log()->warn("job {}: checkpoint not restored: {}", w.job_id, skipped);
      }
    }

    absl::MutexLock l(&core_.mu());
    JobRecord* rec = core_.jobs().Find(w.job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RECOVERING) continue;  // Cancelled.
    v1::Job& job = rec->job;
    if (!point.ok()) {
      core_.Finish(*rec, v1::JOB_FAILED,
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
    // Every map after the rollback has at least this epoch (the next placement's, or an etcd
    // revision above it), every map before it less.
    rb->set_epoch(w.epoch + 1);
    rb->set_step(point->step);
    r->set_recovered_unix_ms(UnixMs(core_.clock().Now()));
    job.mutable_progress()->set_rolled_back_to_step(point->step);
    std::string from =
        !point->files.empty()
            ? absl::StrCat(r->restore_from_size(), " checkpoint file(s) in ", point->dir)
        : w.checkpoint_dir.empty()
            ? std::string("the job has no checkpoint_dir: from the start")
            : absl::StrCat("no complete checkpoint in ", point->dir, ": from the start");
    job.set_state(v1::JOB_QUEUED);
    job.set_reason(absl::StrCat("recovered (", r->recoveries(), " of at most ",
                                core_.options().max_recoveries, ") from: ", w.cause,
                                "; rolled back to step ", point->step, " (", from, ")"));
    job.clear_servers();
    job.clear_workers();
    rec->placement_attempts = 0;
    rec->next_attempt = absl::InfinitePast();
    if (!core_.jobs().Persist(*rec).ok()) continue;
    core_.counters().recoveries->Add();
    Log()->warn("job {}: {}", w.job_id, job.reason());
    core_.Wake();
  }
}

bool RecoveryPass::PromoteBackupsOf(const std::string& job_id, std::string* why) {
  v1::ShardMap map;
  v1::JobSpec spec;
  v1::JobRecovery recovery;
  std::vector<std::string> workers;
  std::string lost;
  {
    absl::MutexLock l(&core_.mu());
    JobRecord* rec = core_.jobs().Find(job_id);
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
  for (const v1::NodeStatus& n : core_.registry().Snapshot()) {
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
  // Each map gets its epoch and is written before any server has it, so that no later map
  // reuses its epoch.
  auto record = [&](v1::ShardMap& m) -> bool {
    absl::MutexLock l(&core_.mu());
    JobRecord* rec = core_.jobs().Find(job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RECOVERING) {
      *why = "the job changed meanwhile";
      return false;
    }
    absl::StatusOr<uint64_t> epoch = core_.NextEpoch(*rec, rec->shard_map.epoch());
    if (!epoch.ok()) {
      *why = std::string(epoch.status().message());
      return false;
    }
    m.set_epoch(*epoch);
    rec->shard_map = m;
    rec->job.set_shard_map_epoch(m.epoch());
    absl::Status s = core_.jobs().Persist(*rec, &m);
    if (!s.ok()) *why = std::string(s.message());
    return s.ok();
  };
  // 1. Every server takes the new map; a backup that becomes primary takes over its copy.
  //    Tasks of the stopped attempts are fenced off. With more than one backup, the others stay
  //    backups under the promoted one and copy it afresh (it seeds them as the map takes effect
  //    there): they take the map first, so that the snapshot finds their new copy.
  if (!record(*next)) return false;
  const uint32_t attempt = NextAttempt(recovery, n);
  std::vector<absl::Status> status(next->servers_size());
  std::vector<bool> fresh(next->servers_size());
  for (int i = 0; i < next->servers_size(); ++i) {
    fresh[i] = !NewlyBacked(map, *next, next->servers(i).node_id()).empty();
  }
  for (const bool phase : {true, false}) {
    ParallelFor(next->servers_size(), [&](size_t i) {
      if (fresh[i] != phase) return;
      v1::UpdateShardMapRequest req;
      *req.mutable_map() = *next;
      req.set_self(next->servers(i).node_id());
      req.set_min_attempt(attempt);
      req.set_seed_new_backups(true);
      for (const std::string& p : NewlyBacked(map, *next, req.self())) {
        v1::ReplicaSeed* seed = req.add_copy_from();
        seed->set_primary(p);
        seed->set_live(true);
      }
      status[i] = core_.rpc().UpdateShardMap(next->servers(i).address(), req);
    });
  }
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
        seeded[i] = core_.rpc().UpdateShardMap(more->servers(i).address(), req);
      });
      for (int i = 0; i < more->servers_size(); ++i) {
        if (!seeded[i].ok()) {
          *why = absl::StrCat("server ", more->servers(i).node_id(),
                              " taking a new copy: ", seeded[i].message());
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
    auto st = core_.rpc().ServerStatus(next->servers(i).address(), job_id);
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
    assigned[r] =
        core_.rpc().AssignTask(address[workers[r]], TaskFor(job_id, spec, *next, r, n, rank_at));
  });
  for (uint32_t r = 0; r < n; ++r) {
    if (assigned[r].ok()) continue;
    *why = absl::StrCat("rank ", r, " on ", workers[r], ": ", assigned[r].message());
    ParallelFor(n, [&](size_t q) {
      if (assigned[q].ok() && !workers[q].empty()) {
        (void)core_.rpc().StopTask(address[workers[q]], job_id, *why);
      }
    });
    const absl::Time until = core_.clock().Now() + core_.options().task_stop_grace;
    while (core_.clock().Now() < until && core_.WorkerStillRuns(workers, job_id)) {
      core_.clock().SleepFor(kStopRecheck);
    }
    return false;
  }
  // 4. Running again.
  absl::MutexLock l(&core_.mu());
  JobRecord* rec = core_.jobs().Find(job_id);
  if (rec == nullptr || rec->job.state() != v1::JOB_RECOVERING) {
    ParallelFor(n, [&](size_t q) {
      if (!workers[q].empty()) {
        (void)core_.rpc().StopTask(address[workers[q]], job_id, "the job changed meanwhile");
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
  r->set_recovered_unix_ms(UnixMs(core_.clock().Now()));
  for (uint32_t q = 0; q < n && static_cast<int>(q) < job.progress().workers_size(); ++q) {
    if (!workers[q].empty()) job.mutable_progress()->mutable_workers(q)->set_step(start[q]);
  }
  job.set_state(v1::JOB_RUNNING);
  job.set_reason(absl::StrCat("recovered with no rollback from: ", r->last_cause(),
                              "; its shards' backups took over"));
  // Not written: the store's recovery reloads the job as RECOVERING (with the promoted map's
  // epoch, written before the servers had it) and rolls it back.
  if (!core_.jobs().Persist(*rec).ok()) return true;
  core_.counters().promotions->Add();
  Log()->warn(
      "job {}: backups of {} took over its shards (map epoch {}); every rank resumed "
      "where the servers had it, no rollback",
      job_id, lost, next->epoch());
  core_.Wake();
  return true;
}

std::unique_ptr<Pass> MakeRecoveryPass(SchedulerCore& core) {
  return std::make_unique<RecoveryPass>(core);
}

}  // namespace pscluster::scheduler
