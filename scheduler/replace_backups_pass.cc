// The replace-backups pass: shards that lost a backup to the drop-backups pass get a new one,
// live, on another live server of the job's map that their primary has not been cut from (none:
// they go on with a copy fewer); a map that did not reach every server is taken back out.
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"
#include "scheduler/recovery.h"

namespace pscluster::scheduler {
namespace {

class ReplaceBackupsPass final : public Pass {
 public:
  explicit ReplaceBackupsPass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "replace_backups"; }
  void Run() override;

 private:
  SchedulerCore& core_;
};

}  // namespace

void ReplaceBackupsPass::Run() {
  struct Work {
    std::string job_id;
    v1::ShardMap before, after;
  };
  std::vector<Work> work;
  {
    absl::MutexLock l(&core_.mu());
    for (JobRecord& rec : core_.jobs()) {
      const std::string& id = rec.job.job_id();
      const v1::JobSpec& spec = rec.job.spec();
      if (rec.job.state() != v1::JOB_RUNNING || spec.replication() <= 1 || rec.resend_map ||
          rec.job.recovery().cut_backups().empty() ||
          core_.clock().Now() < rec.replace_backups_after) {
        continue;
      }
      std::set<std::pair<std::string, std::string>> cut;
      for (const v1::BackupCut& c : rec.job.recovery().cut_backups()) {
        cut.insert({c.primary(), c.backup()});
      }
      std::vector<std::string> candidates;
      for (const v1::ServerEndpoint& ep : rec.shard_map.servers()) {
        auto node = core_.registry().Get(ep.node_id());
        if (node.has_value() && node->state() == v1::NODE_ALIVE) candidates.push_back(ep.node_id());
      }
      std::optional<v1::ShardMap> after =
          AddBackups(rec.shard_map, spec.replication(), candidates, cut);
      if (!after.has_value()) continue;
      absl::StatusOr<uint64_t> epoch = core_.NextEpoch(rec, rec.shard_map.epoch());
      if (!epoch.ok()) break;  // The store failed: nothing is sent.
      after->set_epoch(*epoch);
      Work w{id, rec.shard_map, *after};
      rec.shard_map = *after;
      rec.job.set_shard_map_epoch(after->epoch());
      if (!core_.jobs().Persist(rec, &*after).ok()) break;  // Not written: not sent either.
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
      status[i] = core_.rpc().UpdateShardMap(w.after.servers(i).address(), req);
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
    absl::MutexLock l(&core_.mu());
    JobRecord* rec = core_.jobs().Find(w.job_id);
    if (rec == nullptr || rec->shard_map.epoch() != w.after.epoch()) continue;
    if (why.empty()) {
      core_.counters().backups_replaced->Add();
      Log()->info("job {}: new backup(s) {} in place of unreachable ones (map epoch {})", w.job_id,
                  absl::StrJoin(added, "; "), w.after.epoch());
      continue;
    }
    // A server that missed the map would take it later without its seed: take the new copies
    // back out instead (a map without them, sent again until every server has it).
    v1::ShardMap undo = w.before;
    absl::StatusOr<uint64_t> epoch = core_.NextEpoch(*rec, w.after.epoch());
    if (!epoch.ok()) continue;  // The store failed: nothing is sent.
    undo.set_epoch(*epoch);
    rec->shard_map = undo;
    rec->job.set_shard_map_epoch(undo.epoch());
    if (!core_.jobs().Persist(*rec, &undo).ok()) continue;  // Not written: not sent either.
    rec->resend_map = true;
    rec->replace_backups_after = core_.clock().Now() + core_.options().placement_backoff;
    Log()->warn(
        "job {}: new backup(s) {} not installed everywhere ({}); taken out again (map "
        "epoch {}), tried again in {}",
        w.job_id, absl::StrJoin(added, "; "), why, undo.epoch(),
        absl::FormatDuration(core_.options().placement_backoff));
  }
}

std::unique_ptr<Pass> MakeReplaceBackupsPass(SchedulerCore& core) {
  return std::make_unique<ReplaceBackupsPass>(core);
}

}  // namespace pscluster::scheduler
