// Elastic servers: a running job's set of servers grows or shrinks (ScaleJob), and a server is
// drained of every job's shards (DrainServer), both by the live shard moves of shard_move.cc.
//
// A change (Job.elastic) names the servers the job should end up on. The moves thread takes one
// step per job at a time (StepElastic):
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
#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "scheduler/job_state.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {
namespace {

constexpr uint32_t kMaxFailedMoves = 3;
constexpr char kElasticReason[] = "elastic: ";

bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

bool MoveInFlight(const v1::Job& job) {
  return !job.moves().empty() && (job.moves().rbegin()->state() == v1::MOVE_QUEUED ||
                                  job.moves().rbegin()->state() == v1::MOVE_COPYING);
}

// Why a job's shards cannot move live (empty: they can).
std::string Immovable(const v1::Job& job) {
  if (job.spec().consistency().aggregate()) {
    return absl::StrCat("job ", job.job_id(), " aggregates its pushes (consistency.aggregate); "
                        "its shards do not move live");
  }
  return "";
}

}  // namespace

absl::StatusOr<v1::CreateTablesRequest> Scheduler::TablesFromPrimary(const std::string& job_id,
                                                                     const v1::JobSpec& spec,
                                                                     const std::string& from,
                                                                     const std::string& address) {
  auto st = rpc_->ServerStatus(address, job_id);
  if (!st.ok()) {
    return absl::Status(st.status().code(), absl::StrCat("server ", from, ": ", st.status().message()));
  }
  if (st->jobs_size() != 1 || st->jobs(0).job_id() != job_id) {
    return absl::FailedPreconditionError(absl::StrCat("server ", from, " does not hold job ", job_id));
  }
  const v1::JobOnServer& j = st->jobs(0);
  if (!j.left_workers().empty()) {
    // A server made now would wait for that rank's clock, which never moves.
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", j.left_workers(0), " has left the job; no server joins it until the rank is back"));
  }
  v1::CreateTablesRequest req;
  req.set_job_id(job_id);
  for (const v1::TableStatus& t : j.tables()) {
    if (!t.has_spec()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", from, " does not report the spec of table '", t.name(), "' (older version)"));
    }
    *req.add_tables() = t.spec();
  }
  if (req.tables().empty()) {
    return absl::FailedPreconditionError(absl::StrCat("server ", from, " holds no table of the job yet"));
  }
  *req.mutable_consistency() = spec.consistency();
  req.set_num_workers(j.clocks_size() > 0 ? j.clocks_size() : spec.num_workers());
  req.set_num_virtual_shards(spec.num_virtual_shards());
  req.set_checkpoint_every_steps(spec.checkpoint_every_steps());
  req.set_checkpoint_dir(spec.checkpoint_dir());
  return req;
}

std::vector<std::string> Scheduler::SpareServersLocked(
    const absl::flat_hash_set<std::string>& exclude) {
  absl::flat_hash_map<std::string, uint32_t> hosted;
  for (const JobRecord& rec : jobs_) {
    if (!HoldsResources(rec.job.state())) continue;
    for (const v1::ShardAssignment& a : rec.shard_map.assignments()) ++hosted[a.primary()];
  }
  std::vector<std::pair<uint32_t, std::string>> spare;
  for (const v1::NodeStatus& n : registry_.Live(v1::ROLE_SERVER)) {
    const std::string& id = n.info().node_id();
    if (n.state() != v1::NODE_ALIVE || n.drain() != v1::NODE_IN_SERVICE || exclude.contains(id)) {
      continue;
    }
    spare.emplace_back(hosted[id], id);
  }
  std::sort(spare.begin(), spare.end());
  std::vector<std::string> out;
  for (auto& [n, id] : spare) out.push_back(std::move(id));
  return out;
}

absl::Status Scheduler::StartElasticLocked(JobRecord& rec, std::vector<std::string> servers,
                                           const std::string& reason) {
  v1::ElasticChange change;
  for (std::string& s : servers) change.add_servers(std::move(s));
  change.set_reason(reason);
  change.set_active(true);
  change.set_requested_unix_ms(absl::ToUnixMillis(clock_->Now()));
  *rec.job.mutable_elastic() = change;
  if (absl::Status p = jobs_.Persist(rec); !p.ok()) return p;
  moves_wanted_ = true;
  return absl::OkStatus();
}

absl::Status Scheduler::ScaleJob(const v1::ScaleJobRequest& req, v1::ScaleJobResponse* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  if (req.servers() < 1) return absl::InvalidArgumentError("servers: must be at least 1");
  absl::MutexLock l(&mu_);
  if (!jobs_.error().ok()) return jobs_.error();
  absl::StatusOr<JobRecord*> found = jobs_.FindOrError(req.job_id());
  if (!found.ok()) return found.status();
  JobRecord* rec = *found;
  const v1::Job& job = rec->job;
  if (job.state() != v1::JOB_RUNNING || rec->shard_map.epoch() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("job_id: job ", job.job_id(), " is ",
                                                      JobStateName(job.state()),
                                                      "; only a running job is scaled"));
  }
  if (std::string why = Immovable(job); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("job_id: ", why, "; it cannot be scaled"));
  }
  if (req.servers() < job.spec().replication()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "servers: job ", job.job_id(), " keeps ", job.spec().replication(),
        " copies of every shard on as many servers; it cannot run on ", req.servers()));
  }
  if (req.servers() > rec->shard_map.num_virtual_shards()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "servers: ", req.servers(), " is more than job ", job.job_id(), "'s ",
        rec->shard_map.num_virtual_shards(), " virtual shards"));
  }
  if (job.elastic().active()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job_id: job ", job.job_id(), " is already changing its servers (", job.elastic().reason(),
        "); one change at a time"));
  }
  std::vector<std::string> current;
  absl::flat_hash_set<std::string> in_map;
  for (const v1::ServerEndpoint& ep : rec->shard_map.servers()) {
    in_map.insert(ep.node_id());
    auto n = registry_.Get(ep.node_id());
    // A draining server is the first to go.
    if (n.has_value() && n->drain() != v1::NODE_IN_SERVICE) continue;
    current.push_back(ep.node_id());
  }
  std::vector<std::string> target = current;
  if (target.size() > req.servers()) {
    target.resize(req.servers());
  } else if (target.size() < req.servers()) {
    std::vector<std::string> spare = SpareServersLocked(in_map);
    const size_t need = req.servers() - target.size();
    if (spare.size() < need) {
      return absl::FailedPreconditionError(absl::StrCat(
          "servers: job ", job.job_id(), " has ", current.size(), " server(s) in service and ",
          req.servers(), " needs ", need, " more; only ", spare.size(),
          " other server(s) are alive and in service"));
    }
    target.insert(target.end(), spare.begin(), spare.begin() + need);
  }
  absl::Status s = StartElasticLocked(*rec, target, absl::StrCat("scale to ", req.servers(),
                                                                 " servers"));
  if (!s.ok()) return s;
  *resp->mutable_change() = rec->job.elastic();
  Log()->info("job {}: scaling to {} servers ({})", req.job_id(), req.servers(),
              absl::StrJoin(target, ", "));
  return absl::OkStatus();
}

absl::Status Scheduler::DrainServer(const v1::DrainServerRequest& req,
                                    v1::DrainServerResponse* resp) {
  if (req.node_id().empty()) return absl::InvalidArgumentError("node_id: required");
  absl::MutexLock l(&mu_);
  if (!jobs_.error().ok()) return jobs_.error();
  std::optional<v1::NodeStatus> node = registry_.Get(req.node_id());
  if (!node.has_value()) {
    return absl::NotFoundError(absl::StrCat("node_id: '", req.node_id(), "' is not registered"));
  }
  if (node->info().role() != v1::ROLE_SERVER) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_id: ", req.node_id(), " is a worker; only servers are drained"));
  }
  // Check every job first: a refusal changes nothing.
  std::vector<std::pair<JobRecord*, std::vector<std::string>>> plans;
  absl::flat_hash_set<std::string> self = {req.node_id()};
  for (JobRecord& rec : jobs_) {
    const std::string& id = rec.job.job_id();
    const v1::Job& job = rec.job;
    if (!HoldsResources(job.state()) || !Contains({job.servers().begin(), job.servers().end()},
                                                  req.node_id())) {
      continue;
    }
    if (job.state() != v1::JOB_RUNNING) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node_id: job ", id, " on ", req.node_id(), " is ", JobStateName(job.state()),
          "; drain again once it runs"));
    }
    if (std::string why = Immovable(job); !why.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("node_id: ", req.node_id(), " holds shards of ",
                                                        why, "; it cannot be drained"));
    }
    std::vector<std::string> target;
    if (job.elastic().active()) {
      target.assign(job.elastic().servers().begin(), job.elastic().servers().end());
    } else {
      for (const v1::ServerEndpoint& ep : rec.shard_map.servers()) target.push_back(ep.node_id());
    }
    target.erase(std::remove(target.begin(), target.end(), req.node_id()), target.end());
    // A job keeps its copies of a shard on as many servers: spares make up for the drained one.
    const size_t need = std::max<size_t>(1, job.spec().replication());
    if (target.size() < need) {
      absl::flat_hash_set<std::string> exclude(target.begin(), target.end());
      exclude.insert(req.node_id());
      for (const v1::ServerEndpoint& ep : rec.shard_map.servers()) exclude.insert(ep.node_id());
      std::vector<std::string> spare = SpareServersLocked(exclude);
      if (target.size() + spare.size() < need) {
        return absl::FailedPreconditionError(absl::StrCat(
            "node_id: job ", id, " keeps ", need, " cop", need == 1 ? "y" : "ies",
            " of every shard on as many servers; without ", req.node_id(), " it has ",
            target.size(), " and only ", spare.size(),
            " other server(s) are alive and in service to take its shards"));
      }
      target.insert(target.end(), spare.begin(), spare.begin() + (need - target.size()));
    }
    plans.emplace_back(&rec, std::move(target));
  }
  const v1::NodeDrain drain = plans.empty() ? v1::NODE_DRAINED : v1::NODE_DRAINING;
  absl::Status s = registry_.SetDrain(req.node_id(), drain);
  if (!s.ok()) return s;
  for (auto& [rec, target] : plans) {
    s = StartElasticLocked(*rec, target, absl::StrCat("drain of ", req.node_id()));
    if (!s.ok()) return s;
    resp->add_jobs(rec->job.job_id());
  }
  resp->set_drain(drain);
  Log()->info("server {}: {} ({} job(s) to move off: {})", req.node_id(),
              drain == v1::NODE_DRAINED ? "drained" : "draining", resp->jobs_size(),
              absl::StrJoin(resp->jobs(), ", "));
  return absl::OkStatus();
}

absl::Status Scheduler::UndrainServer(const v1::UndrainServerRequest& req,
                                      v1::UndrainServerResponse* resp) {
  if (req.node_id().empty()) return absl::InvalidArgumentError("node_id: required");
  {
    absl::MutexLock l(&mu_);
    if (!jobs_.error().ok()) return jobs_.error();
  }
  absl::Status s = registry_.SetDrain(req.node_id(), v1::NODE_IN_SERVICE);
  if (!s.ok()) return s;
  resp->set_drain(v1::NODE_IN_SERVICE);
  Log()->info("server {}: back in service", req.node_id());
  return absl::OkStatus();
}

void Scheduler::CountElasticMove(JobRecord& rec, const v1::ShardMove& move, bool done) {
  if (!rec.job.has_elastic()) return;  // Never scaled nor drained: nothing to count.
  v1::ElasticChange* c = rec.job.mutable_elastic();
  if (!c->active() || move.reason().rfind(kElasticReason, 0) != 0 ||
      move.requested_unix_ms() < c->requested_unix_ms()) {
    return;
  }
  if (done) {
    c->set_moves_done(c->moves_done() + 1);
    return;
  }
  c->set_moves_failed(c->moves_failed() + 1);
  if (c->moves_failed() >= kMaxFailedMoves) {
    c->set_active(false);
    c->set_finished_unix_ms(absl::ToUnixMillis(clock_->Now()));
    c->set_result(absl::StrCat("stopped: ", c->moves_failed(), " moves failed, the last: ",
                               move.result()));
    Log()->warn("job {}: {} stopped: {}", rec.job.job_id(), c->reason(), c->result());
  }
}

void Scheduler::StepElastic() {
  std::vector<std::pair<std::string, std::string>> removals;  // (job, server)
  {
    absl::MutexLock l(&mu_);
    if (!jobs_.error().ok()) return;
    const absl::Time now = clock_->Now();
    for (JobRecord& rec : jobs_) {
      const std::string& id = rec.job.job_id();
      v1::Job& job = rec.job;
      if (!job.has_elastic() || !job.elastic().active()) continue;
      v1::ElasticChange* c = job.mutable_elastic();
      auto conclude = [&](const std::string& result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        c->set_active(false);
        c->set_result(result);
        c->set_finished_unix_ms(absl::ToUnixMillis(now));
        Log()->info("job {}: {}: {}", id, c->reason(), result);
        return jobs_.Persist(rec).ok();
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
          if (best.empty() || held[s].size() + backed[s].size() <
                                  held[best].size() + backed[best].size()) {
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
        if (!conclude(absl::StrCat("stopped: no server of the set can take a copy of shard ",
                                   shard))) {
          return;
        }
        continue;
      }
      if (!from.empty()) {
        std::optional<v1::NodeStatus> t = registry_.Get(to);
        if (!t.has_value() || t->state() != v1::NODE_ALIVE ||
            t->drain() != v1::NODE_IN_SERVICE) {
          // Waits while the target is suspect; gives up on a dead or drained one.
          if (t.has_value() && t->state() == v1::NODE_SUSPECT) continue;
          if (!conclude(absl::StrCat("stopped: server ", to, " is no longer alive and in service"))) {
            return;
          }
          continue;
        }
        v1::ShardMove queued;
        absl::Status s = QueueMove(rec, shard, from, to,
                                   absl::StrCat(kElasticReason, c->reason(), ": shard ", shard,
                                                backup ? "'s backup" : "", " to ", to),
                                   &queued);
        if (!s.ok()) {
          if (!jobs_.error().ok()) return;
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
      if (!conclude(absl::StrCat("done: ", target.size(), " server(s) (", absl::StrJoin(counts, ", "),
                                 " shards), ", c->moves_done(), " shard(s) moved"))) {
        return;
      }
    }
  }
  for (const auto& [job, node] : removals) RemoveServerFromJob(job, node);
  if (!removals.empty()) {
    absl::MutexLock l(&mu_);
    moves_wanted_ = true;  // The next step right away.
  }
  // Draining servers that no job uses any more are drained.
  absl::flat_hash_set<std::string> used;
  {
    absl::MutexLock l(&mu_);
    for (const JobRecord& rec : jobs_) {
      if (!HoldsResources(rec.job.state())) continue;
      used.insert(rec.job.servers().begin(), rec.job.servers().end());
    }
  }
  for (const v1::NodeStatus& n : registry_.Snapshot()) {
    if (n.drain() != v1::NODE_DRAINING || used.contains(n.info().node_id())) continue;
    absl::Status s = registry_.SetDrain(n.info().node_id(), v1::NODE_DRAINED);
    if (!s.ok()) {
      (void)RegistryError(s);  // Sticky when the store failed; tried again next time.
      continue;
    }
    Log()->info("server {}: drained (no job's shards left on it; it can be stopped)",
                n.info().node_id());
  }
}

void Scheduler::RemoveServerFromJob(const std::string& job_id, const std::string& node) {
  v1::ShardMap next;
  {
    absl::MutexLock l(&mu_);
    JobRecord* rec = jobs_.Find(job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RUNNING || MoveInFlight(rec->job)) return;
    for (const v1::ShardAssignment& a : rec->shard_map.assignments()) {
      if (a.primary() == node || Contains({a.backups().begin(), a.backups().end()}, node)) {
        return;  // It holds a shard again: the next step moves it first.
      }
    }
    next = rec->shard_map;
    next.set_epoch(next.epoch() + 1);
    auto* servers = next.mutable_servers();
    servers->erase(std::remove_if(servers->begin(), servers->end(),
                                  [&](const v1::ServerEndpoint& ep) { return ep.node_id() == node; }),
                   servers->end());
    rec->shard_map = next;
    rec->job.set_shard_map_epoch(next.epoch());
    rec->job.clear_servers();
    for (const v1::ServerEndpoint& ep : next.servers()) rec->job.add_servers(ep.node_id());
    if (!jobs_.Persist(*rec, &next).ok()) return;  // Not written: not sent either.
  }
  std::vector<absl::Status> status(next.servers_size());
  ParallelFor(next.servers_size(), [&](size_t i) {
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = next;
    req.set_self(next.servers(i).node_id());
    status[i] = rpc_->UpdateShardMap(next.servers(i).address(), req);
  });
  absl::MutexLock l(&mu_);
  JobRecord* rec = jobs_.Find(job_id);
  if (rec == nullptr) return;
  for (int i = 0; i < next.servers_size(); ++i) {
    if (status[i].ok()) continue;
    if (rec->job.state() == v1::JOB_RUNNING && rec->shard_map.epoch() == next.epoch()) {
      // The job cannot go on with two views of its servers.
      StartRecovery(*rec, absl::StrCat("taking server ", node, " out of the map failed: server ",
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
  c.not_before = clock_->Now() + options_.task_stop_grace;
  cleanups_.push_back(std::move(c));
  Log()->info("job {}: server {} left its map (epoch {})", job_id, node, next.epoch());
  Wake();
}

}  // namespace pscluster::scheduler
