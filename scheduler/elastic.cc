// Elastic servers, the handlers: a running job's set of servers grows or shrinks (ScaleJob), and
// a server is drained of every job's shards (DrainServer) or back in service (UndrainServer).
// Each records a change (Job.elastic) naming the servers the job should end up on; the elastic
// pass (elastic_pass.cc) takes its steps on the moves thread, by the live shard moves of
// moves_pass.cc.
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "scheduler/job_state.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {
namespace {

// Why a job's shards cannot move live (empty: they can).
std::string Immovable(const v1::Job& job) {
  if (job.spec().consistency().aggregate()) {
    return absl::StrCat("job ", job.job_id(),
                        " aggregates its pushes (consistency.aggregate); "
                        "its shards do not move live");
  }
  return "";
}

}  // namespace

std::vector<std::string> Scheduler::SpareServersLocked(
    const absl::flat_hash_set<std::string>& exclude) {
  absl::flat_hash_map<std::string, uint32_t> hosted;
  for (const JobRecord& rec : core_.jobs()) {
    if (!HoldsResources(rec.job.state())) continue;
    for (const v1::ShardAssignment& a : rec.shard_map.assignments()) ++hosted[a.primary()];
  }
  std::vector<std::pair<uint32_t, std::string>> spare;
  for (const v1::NodeStatus& n : core_.registry().Live(v1::ROLE_SERVER)) {
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
  change.set_requested_unix_ms(absl::ToUnixMillis(core_.clock().Now()));
  *rec.job.mutable_elastic() = change;
  if (absl::Status p = core_.jobs().Persist(rec); !p.ok()) return p;
  core_.WantMoves();
  return absl::OkStatus();
}

absl::Status Scheduler::ScaleJob(const v1::ScaleJobRequest& req, v1::ScaleJobResponse* resp) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  if (req.servers() < 1) return absl::InvalidArgumentError("servers: must be at least 1");
  absl::MutexLock l(&core_.mu());
  if (!core_.jobs().error().ok()) return core_.jobs().error();
  absl::StatusOr<JobRecord*> found = core_.jobs().FindOrError(req.job_id());
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
    return absl::InvalidArgumentError(
        absl::StrCat("servers: ", req.servers(), " is more than job ", job.job_id(), "'s ",
                     rec->shard_map.num_virtual_shards(), " virtual shards"));
  }
  if (job.elastic().active()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job_id: job ", job.job_id(), " is already changing its servers (",
                     job.elastic().reason(), "); one change at a time"));
  }
  std::vector<std::string> current;
  absl::flat_hash_set<std::string> in_map;
  for (const v1::ServerEndpoint& ep : rec->shard_map.servers()) {
    in_map.insert(ep.node_id());
    auto n = core_.registry().Get(ep.node_id());
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
      return absl::FailedPreconditionError(
          absl::StrCat("servers: job ", job.job_id(), " has ", current.size(),
                       " server(s) in service and ", req.servers(), " needs ", need, " more; only ",
                       spare.size(), " other server(s) are alive and in service"));
    }
    target.insert(target.end(), spare.begin(), spare.begin() + need);
  }
  absl::Status s =
      StartElasticLocked(*rec, target, absl::StrCat("scale to ", req.servers(), " servers"));
  if (!s.ok()) return s;
  *resp->mutable_change() = rec->job.elastic();
  Log()->info("job {}: scaling to {} servers ({})", req.job_id(), req.servers(),
              absl::StrJoin(target, ", "));
  return absl::OkStatus();
}

absl::Status Scheduler::DrainServer(const v1::DrainServerRequest& req,
                                    v1::DrainServerResponse* resp) {
  if (req.node_id().empty()) return absl::InvalidArgumentError("node_id: required");
  absl::MutexLock l(&core_.mu());
  if (!core_.jobs().error().ok()) return core_.jobs().error();
  std::optional<v1::NodeStatus> node = core_.registry().Get(req.node_id());
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
  for (JobRecord& rec : core_.jobs()) {
    const std::string& id = rec.job.job_id();
    const v1::Job& job = rec.job;
    if (!HoldsResources(job.state()) || !Holds(job.servers(), req.node_id())) {
      continue;
    }
    if (job.state() != v1::JOB_RUNNING) {
      return absl::FailedPreconditionError(absl::StrCat("node_id: job ", id, " on ", req.node_id(),
                                                        " is ", JobStateName(job.state()),
                                                        "; drain again once it runs"));
    }
    if (std::string why = Immovable(job); !why.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node_id: ", req.node_id(), " holds shards of ", why, "; it cannot be drained"));
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
        return absl::FailedPreconditionError(
            absl::StrCat("node_id: job ", id, " keeps ", need, " cop", need == 1 ? "y" : "ies",
                         " of every shard on as many servers; without ", req.node_id(), " it has ",
                         target.size(), " and only ", spare.size(),
                         " other server(s) are alive and in service to take its shards"));
      }
      target.insert(target.end(), spare.begin(), spare.begin() + (need - target.size()));
    }
    plans.emplace_back(&rec, std::move(target));
  }
  const v1::NodeDrain drain = plans.empty() ? v1::NODE_DRAINED : v1::NODE_DRAINING;
  absl::Status s = core_.registry().SetDrain(req.node_id(), drain);
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
    absl::MutexLock l(&core_.mu());
    if (!core_.jobs().error().ok()) return core_.jobs().error();
  }
  absl::Status s = core_.registry().SetDrain(req.node_id(), v1::NODE_IN_SERVICE);
  if (!s.ok()) return s;
  resp->set_drain(v1::NODE_IN_SERVICE);
  Log()->info("server {}: back in service", req.node_id());
  return absl::OkStatus();
}

}  // namespace pscluster::scheduler
