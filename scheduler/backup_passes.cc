// The replication passes: backups their primary cannot reach leave the map, shards that lost a
// backup get a new one live, and a lost server's backups are promoted to primaries.
#include <algorithm>
#include <functional>
#include <set>

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

void Scheduler::DropUnreachableBackups() {
  struct Work {
    std::string job_id;
    v1::ShardMap map;
    std::string what;  // For the log.
  };
  std::vector<Work> work;
  {
    absl::MutexLock l(&mu_);
    for (JobRecord& rec : jobs_) {
      const std::string& id = rec.job.job_id();
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
        if (!jobs_.Persist(rec, &next).ok()) break;  // Not written: not sent either.
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
      JobRecord* rec = jobs_.Find(w.job_id);
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
    for (JobRecord& rec : jobs_) {
      const std::string& id = rec.job.job_id();
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
      if (!jobs_.Persist(rec, &*after).ok()) break;  // Not written: not sent either.
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
    JobRecord* rec = jobs_.Find(w.job_id);
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
    if (!jobs_.Persist(*rec, &undo).ok()) continue;  // Not written: not sent either.
    rec->resend_map = true;
    rec->replace_backups_after = clock_->Now() + options_.placement_backoff;
    Log()->warn("job {}: new backup(s) {} not installed everywhere ({}); taken out again (map "
                "epoch {}), tried again in {}",
                w.job_id, absl::StrJoin(added, "; "), why, undo.epoch(),
                absl::FormatDuration(options_.placement_backoff));
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
    JobRecord* rec = jobs_.Find(job_id);
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
    JobRecord* rec = jobs_.Find(job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RECOVERING) {
      *why = "the job changed meanwhile";
      return false;
    }
    rec->shard_map = m;
    rec->job.set_shard_map_epoch(m.epoch());
    absl::Status s = jobs_.Persist(*rec, &m);
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
      status[i] = rpc_->UpdateShardMap(next->servers(i).address(), req);
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
    const absl::Time until = clock_->Now() + options_.task_stop_grace;
    while (clock_->Now() < until && WorkerStillRuns(workers, job_id)) {
      clock_->SleepFor(kStopRecheck);
    }
    return false;
  }
  // 4. Running again.
  absl::MutexLock l(&mu_);
  JobRecord* rec = jobs_.Find(job_id);
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
  if (!jobs_.Persist(*rec).ok()) return true;
  promotions_->Add();
  Log()->warn("job {}: backups of {} took over its shards (map epoch {}); every rank resumed "
              "where the servers had it, no rollback",
              job_id, lost, next->epoch());
  Wake();
  return true;
}

}  // namespace pscluster::scheduler
