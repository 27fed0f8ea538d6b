// The drop-backups pass: backups that their primary cannot reach (a partition between two
// servers, reported by the poll pass) leave the job's map, so that the primary's pushes go
// through again with fewer copies; a map that did not reach every server is sent again.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"

namespace pscluster::scheduler {
namespace {

class DropUnreachableBackupsPass final : public Pass {
 public:
  explicit DropUnreachableBackupsPass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "drop_unreachable_backups"; }
  void Run() override;

 private:
  SchedulerCore& core_;
};

}  // namespace

void DropUnreachableBackupsPass::Run() {
  struct Work {
    std::string job_id;
    v1::ShardMap map;
    std::string what;  // For the log.
  };
  std::vector<Work> work;
  {
    absl::MutexLock l(&core_.mu());
    for (JobRecord& rec : core_.jobs()) {
      const std::string& id = rec.job.job_id();
      if (rec.job.state() != v1::JOB_RUNNING) {
        rec.unreachable_backups.clear();
        continue;
      }
      if (rec.unreachable_backups.empty() && !rec.resend_map) continue;
      v1::ShardMap next = rec.shard_map;
      std::vector<std::string> dropped;
      for (const auto& [primary, backup] : rec.unreachable_backups) {
        auto node = core_.registry().Get(backup);
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
          dropped.push_back(
              absl::StrCat(backup, " as backup of ", shards, " shard(s) of ", primary));
        }
      }
      rec.unreachable_backups.clear();
      if (dropped.empty() && !rec.resend_map) continue;
      if (!dropped.empty()) {
        absl::StatusOr<uint64_t> epoch = core_.NextEpoch(rec, next.epoch());
        if (!epoch.ok()) break;  // The store failed: nothing is sent.
        next.set_epoch(*epoch);
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
          core_.cleanups().push_back(std::move(c));
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
        if (!core_.jobs().Persist(rec, &next).ok()) break;  // Not written: not sent either.
        core_.counters().backups_dropped->Add(dropped.size());
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
      status[i] = core_.rpc().UpdateShardMap(w.map.servers(i).address(), req);
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
      Log()->warn("job {}: map epoch {} not installed everywhere ({}); sending it again", w.job_id,
                  w.map.epoch(), why);
      absl::MutexLock l(&core_.mu());
      JobRecord* rec = core_.jobs().Find(w.job_id);
      if (rec != nullptr && rec->shard_map.epoch() == w.map.epoch()) rec->resend_map = true;
    }
  }
}

std::unique_ptr<Pass> MakeDropUnreachableBackupsPass(SchedulerCore& core) {
  return std::make_unique<DropUnreachableBackupsPass>(core);
}

}  // namespace pscluster::scheduler
