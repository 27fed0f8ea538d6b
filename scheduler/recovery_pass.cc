// The recovery pass: RECOVERING jobs have their tasks stopped, then their lost server's backups
// promoted or the job dropped and rolled back to its newest complete checkpoint and queued again.
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
    for (const JobRecord& rec : jobs_) {
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
      auto node = registry_.Get(w.workers[i]);
      if (!node.has_value() || !IsLive(*node)) return;
      absl::Status s = rpc_->StopTask(node->info().address(), w.job_id, why);
      if (!s.ok()) Log()->warn("job {}: stopping the task on {}: {}", w.job_id, w.workers[i], s);
    });
    const absl::Time until = clock_->Now() + options_.task_stop_grace;
    while (clock_->Now() < until && WorkerStillRuns(w.workers, w.job_id)) {
      clock_->SleepFor(kStopRecheck);
    }
    {
      bool promote = false;
      {
        absl::MutexLock l(&mu_);
        JobRecord* rec = jobs_.Find(w.job_id);
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
    auto point = FindRecoveryPoint(w.checkpoint_dir, w.job_id, w.num_shards, w.rollbacks,
                                   options_.checkpoint_root, options_.checkpoint_fs);
    if (point.ok()) {
      for (const std::string& skipped : point->skipped) {
        Log()->warn("job {}: checkpoint not restored: {}", w.job_id, skipped);
      }
    }

    absl::MutexLock l(&mu_);
    JobRecord* rec = jobs_.Find(w.job_id);
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
    if (!jobs_.Persist(*rec).ok()) continue;
    recoveries_->Add();
    Log()->warn("job {}: {}", w.job_id, job.reason());
    Wake();
  }
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

}  // namespace pscluster::scheduler
