// The elastic pass: the steps of a change of a running job's servers (ScaleJob, DrainServer in
// elastic.cc), each carried out by the live shard moves of moves_pass.cc, which runs this pass.
//
// A change (Job.elastic) names the servers the job should end up on. The moves thread takes one
// step per job at a time (this pass):
//   1. a server of the map outside the set that still holds shards gives one up (its lowest
//      index; primaries first, then backups) to the set's server holding the fewest copies that
//      holds no copy of that shard;
//   2. otherwise, while the set's fullest server holds two primaries more than its emptiest, it
//      gives one (its highest index of which the emptiest holds no copy) to the emptiest (a
//      server joining holds none at first: its first move gives it the job's tables and puts it
//      into the map);
//   3. otherwise a server of the map outside the set (it holds nothing now) leaves the map: the
//      new map goes to every other server, then the job is dropped on it;
//   4. otherwise the change is done.
// A third failed move, or the job leaving RUNNING, ends the change (the job keeps the servers
// it has then; the rebalancer, if on, carries on from there by load).
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/job_state.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"

namespace pscluster::scheduler {
namespace {

bool MoveInFlight(const v1::Job& job) {
  return !job.moves().empty() && (job.moves().rbegin()->state() == v1::MOVE_QUEUED ||
                                  job.moves().rbegin()->state() == v1::MOVE_COPYING);
}

class ElasticPass final : public Pass {
 public:
  explicit ElasticPass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "elastic"; }
  void Run() override;

 private:
  // Takes `node` (which holds none of its shards) out of the job's map: the new map to every
  // other server, then a DropJob on it.
  void RemoveServerFromJob(const std::string& job_id, const std::string& node);

  SchedulerCore& core_;
};

}  // namespace

void ElasticPass::Run() {
  std::vector<std::pair<std::string, std::string>> removals;  // (job, server)
  {
    absl::MutexLock l(&core_.mu());
    if (!core_.jobs().error().ok()) return;
    const absl::Time now = core_.clock().Now();
    for (JobRecord& rec : core_.jobs()) {
      const std::string& id = rec.job.job_id();
      v1::Job& job = rec.job;
      if (!job.has_elastic() || !job.elastic().active()) continue;
      v1::ElasticChange* c = job.mutable_elastic();
      auto conclude = [&](const std::string& result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu()) {
        c->set_active(false);
        c->set_result(result);
        c->set_finished_unix_ms(absl::ToUnixMillis(now));
        Log()->info("job {}: {}: {}", id, c->reason(), result);
        return core_.jobs().Persist(rec).ok();
      };
      if (job.state() != v1::JOB_RUNNING) {
        if (!conclude(absl::StrCat("stopped: the job is ", JobStateName(job.state())))) return;
        continue;
      }
      if (MoveInFlight(job)) continue;
      const std::vector<std::string> target(c->servers().begin(), c->servers().end());
      std::map<std::string, std::vector<uint32_t>> held;    // node -> primaries, by index
      std::map<std::string, std::vector<uint32_t>> backed;  // node -> shards it backs up
      absl::flat_hash_map<uint32_t, std::vector<std::string>> copies;  // shard -> its servers
      for (const std::string& s : target) held[s];
      std::vector<std::string> in_map;
      for (const v1::ServerEndpoint& ep : rec.shard_map.servers()) {
        in_map.push_back(ep.node_id());
        held[ep.node_id()];
      }
      for (const v1::ShardAssignment& a : rec.shard_map.assignments()) {
        held[a.primary()].push_back(a.shard());
        copies[a.shard()].push_back(a.primary());
        for (const std::string& b : a.backups()) {
          backed[b].push_back(a.shard());
          copies[a.shard()].push_back(b);
        }
      }
      // The set's server holding the fewest primaries and no copy of `shard` (and the most);
      // ties by the set's order.
      auto least = [&](uint32_t shard) {
        std::string best;
        for (const std::string& s : target) {
          if (Contains(copies[shard], s)) continue;
          if (best.empty() ||
              held[s].size() + backed[s].size() < held[best].size() + backed[best].size()) {
            best = s;
          }
        }
        return best;
      };
      std::string from, to;
      uint32_t shard = 0;
      bool backup = false;
      for (const std::string& s : in_map) {
        if (Contains(target, s)) continue;
        if (!held[s].empty()) {
          from = s;
          shard = held[s].front();
        } else if (!backed[s].empty()) {
          from = s;
          shard = backed[s].front();
          backup = true;
        } else {
          continue;
        }
        to = least(shard);
        break;
      }
      if (from.empty()) {
        std::string most, few;
        for (const std::string& s : target) {
          if (most.empty() || held[s].size() > held[most].size()) most = s;
          if (few.empty() || held[s].size() < held[few].size()) few = s;
        }
        // Its highest shard of which `few` holds no copy.
        for (auto it = held[most].rbegin(); it != held[most].rend(); ++it) {
          if (held[most].size() < held[few].size() + 2) break;
          if (Contains(copies[*it], few)) continue;
          from = most;
          shard = *it;
          to = few;
          break;
        }
      }
      if (!from.empty() && to.empty()) {
        // Fewer servers in the set than copies of a shard: the scale refused it already.
        if (!conclude(
                absl::StrCat("stopped: no server of the set can take a copy of shard ", shard))) {
          return;
        }
        continue;
      }
      if (!from.empty()) {
        std::optional<v1::NodeStatus> t = core_.registry().Get(to);
        if (!t.has_value() || t->state() != v1::NODE_ALIVE || t->drain() != v1::NODE_IN_SERVICE) {
          // Waits while the target is suspect; gives up on a dead or drained one.
          if (t.has_value() && t->state() == v1::NODE_SUSPECT) continue;
          if (!conclude(
                  absl::StrCat("stopped: server ", to, " is no longer alive and in service"))) {
            return;
          }
          continue;
        }
        v1::ShardMove queued;
        absl::Status s = core_.QueueMove(rec, shard, from, to,
                                         absl::StrCat(kElasticReason, c->reason(), ": shard ",
                                                      shard, backup ? "'s backup" : "", " to ", to),
                                         &queued);
        if (!s.ok()) {
          if (!core_.jobs().error().ok()) return;
          if (!conclude(absl::StrCat("stopped: ", s.message()))) return;
        }
        continue;
      }
      bool leaving = false;
      for (const std::string& s : in_map) {
        if (!Contains(target, s)) {
          removals.emplace_back(id, s);
          leaving = true;
          break;
        }
      }
      if (leaving) continue;
      std::vector<std::string> counts;
      for (const std::string& s : target) counts.push_back(absl::StrCat(s, " ", held[s].size()));
      if (!conclude(absl::StrCat("done: ", target.size(), " server(s) (",
                                 absl::StrJoin(counts, ", "), " shards), ", c->moves_done(),
                                 " shard(s) moved"))) {
        return;
      }
    }
  }
  for (const auto& [job, node] : removals) RemoveServerFromJob(job, node);
  if (!removals.empty()) {
    absl::MutexLock l(&core_.mu());
    core_.WantMoves();  // The next step right away.
  }
  // Draining servers that no job uses any more are drained.
  absl::flat_hash_set<std::string> used;
  {
    absl::MutexLock l(&core_.mu());
    for (const JobRecord& rec : core_.jobs()) {
      if (!HoldsResources(rec.job.state())) continue;
      used.insert(rec.job.servers().begin(), rec.job.servers().end());
    }
  }
  for (const v1::NodeStatus& n : core_.registry().Snapshot()) {
    if (n.drain() != v1::NODE_DRAINING || used.contains(n.info().node_id())) continue;
    absl::Status s = core_.registry().SetDrain(n.info().node_id(), v1::NODE_DRAINED);
    if (!s.ok()) {
      (void)core_.RegistryError(s);  // Sticky when the store failed; tried again next time.
      continue;
    }
    Log()->info("server {}: drained (no job's shards left on it; it can be stopped)",
                n.info().node_id());
  }
}

void ElasticPass::RemoveServerFromJob(const std::string& job_id, const std::string& node) {
  v1::ShardMap next;
  {
    absl::MutexLock l(&core_.mu());
    JobRecord* rec = core_.jobs().Find(job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RUNNING || MoveInFlight(rec->job)) return;
    for (const v1::ShardAssignment& a : rec->shard_map.assignments()) {
      if (a.primary() == node || Holds(a.backups(), node)) {
        return;  // It holds a shard again: the next step moves it first.
      }
    }
    next = rec->shard_map;
    absl::StatusOr<uint64_t> epoch = core_.NextEpoch(*rec, next.epoch());
    if (!epoch.ok()) return;  // The store failed: nothing is sent.
    next.set_epoch(*epoch);
    auto* servers = next.mutable_servers();
    servers->erase(
        std::remove_if(servers->begin(), servers->end(),
                       [&](const v1::ServerEndpoint& ep) { return ep.node_id() == node; }),
        servers->end());
    rec->shard_map = next;
    rec->job.set_shard_map_epoch(next.epoch());
    rec->job.clear_servers();
    for (const v1::ServerEndpoint& ep : next.servers()) rec->job.add_servers(ep.node_id());
    if (!core_.jobs().Persist(*rec, &next).ok()) return;  // Not written: not sent either.
  }
  std::vector<absl::Status> status(next.servers_size());
  ParallelFor(next.servers_size(), [&](size_t i) {
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = next;
    req.set_self(next.servers(i).node_id());
    status[i] = core_.rpc().UpdateShardMap(next.servers(i).address(), req);
  });
  absl::MutexLock l(&core_.mu());
  JobRecord* rec = core_.jobs().Find(job_id);
  if (rec == nullptr) return;
  for (int i = 0; i < next.servers_size(); ++i) {
    if (status[i].ok()) continue;
    if (rec->job.state() == v1::JOB_RUNNING && rec->shard_map.epoch() == next.epoch()) {
      // The job cannot go on with two views of its servers.
      core_.StartRecovery(*rec,
                          absl::StrCat("taking server ", node, " out of the map failed: server ",
                                       next.servers(i).node_id(), ": ", status[i].message()));
    }
    return;
  }
  // Workers still on the previous map are refused by every server and fetch this one; the job
  // is dropped on the server that left once they have had the time to.
  Cleanup c;
  c.drop_job = true;
  c.stale_copy = true;
  c.node_id = node;
  c.job_id = job_id;
  c.reason = absl::StrCat("it left the job's servers (", rec->job.elastic().reason(), ")");
  c.not_before = core_.clock().Now() + core_.options().task_stop_grace;
  core_.cleanups().push_back(std::move(c));
  Log()->info("job {}: server {} left its map (epoch {})", job_id, node, next.epoch());
  core_.Wake();
}

std::unique_ptr<Pass> MakeElasticPass(SchedulerCore& core) {
  return std::make_unique<ElasticPass>(core);
}

}  // namespace pscluster::scheduler
