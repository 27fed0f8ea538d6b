// The placement pass: queued jobs get servers and workers (PlacementPolicy), the shard map goes
// to the servers and the tasks to the workers; a refused or failed placement is rolled back and
// retried later, or fails the job after max_placement_attempts.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/job_state.h"
#include "scheduler/membership.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"
#include "scheduler/progress.h"
#include "scheduler/recovery.h"

namespace pscluster::scheduler {
namespace {

// How soon a placement that waits for workers still stopping an ended job's task looks again.
constexpr absl::Duration kStoppingRetry = absl::Milliseconds(200);

class PlacementPass final : public Pass {
 public:
  explicit PlacementPass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "place"; }
  // Places the queued jobs that are due: plans under the lock, calls the nodes outside it.
  void Run() override;

 private:
  // Placement calls prepared under the lock and made outside it.
  struct PlacementWork {
    std::string job_id;
    v1::JobSpec spec;
    v1::ShardMap map;
    std::vector<std::string> workers;  // node ids by rank
    v1::JobRecovery recovery;          // What the servers restore and where the workers resume.
  };
  std::vector<PlacementWork> PlaceQueuedJobs();
  void ExecutePlacement(const PlacementWork& work);
  // Before a placement calls anyone: if a chosen worker still runs the task of a job that has
  // ended, puts the job back in the queue (the attempt not counted) and returns true.
  bool WaitForStoppingWorkers(const PlacementWork& work);

  SchedulerCore& core_;
};

}  // namespace

void PlacementPass::Run() {
  for (const PlacementWork& w : PlaceQueuedJobs()) ExecutePlacement(w);
}

std::vector<PlacementPass::PlacementWork> PlacementPass::PlaceQueuedJobs() {
  {
    // Most passes have nothing to place: skip the registry snapshot then.
    absl::MutexLock l(&core_.mu());
    bool any = false;
    for (const JobRecord& rec : core_.jobs()) {
      any = any || rec.job.state() == v1::JOB_QUEUED || rec.placement_pending;
    }
    if (!any) return {};
  }
  std::vector<v1::NodeStatus> nodes = core_.registry().Snapshot();
  absl::Time now = core_.clock().Now();
  absl::MutexLock l(&core_.mu());
  std::vector<PlacementWork> work;

  // What running jobs hold now.
  absl::flat_hash_set<std::string> busy;
  absl::flat_hash_map<std::string, uint32_t> hosted;
  for (const JobRecord& rec : core_.jobs()) {
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
      if (n.drain() != v1::NODE_IN_SERVICE) continue;  // Draining or drained: nothing new.
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
      c.allow_entrypoints = n.info().allow_entrypoints();
      workers.push_back(std::move(c));
    }
  }

  for (JobRecord& rec : core_.jobs()) {
    const std::string& id = rec.job.job_id();
    v1::Job& job = rec.job;
    if (job.state() == v1::JOB_PLACING && rec.placement_pending) {
      // Restored mid-placement: make the same calls again (they are idempotent).
      PlacementWork w{id,
                      job.spec(),
                      rec.shard_map,
                      {job.workers().begin(), job.workers().end()},
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
    req.entrypoint = job.spec().has_entrypoint();
    auto placed = core_.placement().Place(req, servers, workers);
    if (!placed.ok()) {
      if (placed.status().code() == absl::StatusCode::kResourceExhausted) {
        std::string reason = absl::StrCat("waiting for resources: ", placed.status().message());
        if (job.reason() != reason && job.reason().rfind("placement failed", 0) != 0) {
          job.set_reason(reason);
          if (!core_.jobs().Persist(rec).ok()) break;
        }
      } else {
        core_.Finish(rec, v1::JOB_FAILED,
                     absl::StrCat("cannot be placed: ", placed.status().message()));
      }
      continue;
    }
    absl::StatusOr<uint64_t> next_epoch = core_.NextEpoch(rec, rec.shard_map.epoch());
    if (!next_epoch.ok()) break;  // The store failed: nothing is placed.
    const uint64_t epoch = *next_epoch;
    job.set_state(v1::JOB_PLACING);
    job.clear_reason();
    job.clear_servers();
    job.clear_workers();
    for (const std::string& s : placed->servers) job.add_servers(s);
    for (const std::string& w : placed->workers) job.add_workers(w);
    placed->shard_map.set_epoch(epoch);
    job.set_shard_map_epoch(epoch);
    int64_t rolled_back = job.progress().rolled_back_to_step();
    *job.mutable_progress() = InitialProgress(placed->workers);
    job.mutable_progress()->set_rolled_back_to_step(rolled_back);
    rec.shard_map = placed->shard_map;
    rec.server_waiting_for.clear();
    if (!core_.jobs().Persist(rec, &rec.shard_map).ok()) break;  // Not written: not sent either.
    Log()->info("job {} placed: shard map epoch {}, servers [{}], workers [{}]", id, epoch,
                absl::StrJoin(placed->servers, ", "), absl::StrJoin(placed->workers, ", "));
    // What this job takes is gone for the next ones.
    absl::flat_hash_set<std::string> taken(placed->workers.begin(), placed->workers.end());
    workers.erase(
        std::remove_if(workers.begin(), workers.end(),
                       [&](const WorkerCandidate& c) { return taken.contains(c.node_id); }),
        workers.end());
    absl::flat_hash_map<std::string, uint32_t> added;
    for (const v1::ShardAssignment& a : rec.shard_map.assignments()) ++added[a.primary()];
    for (ServerCandidate& c : servers) c.shards_hosted += added[c.node_id];
    work.push_back(PlacementWork{id, job.spec(), rec.shard_map, placed->workers, job.recovery()});
  }
  return work;
}

bool PlacementPass::WaitForStoppingWorkers(const PlacementWork& w) {
  const uint32_t n = w.workers.size();
  std::vector<std::string> busy_with(n);
  ParallelFor(n, [&](size_t rank) {
    auto status = core_.registry().Get(w.workers[rank]);
    if (!status.has_value()) return;
    auto ws = core_.rpc().WorkerStatus(status->info().address());
    if (ws.ok() && ws->busy() && ws->job_id() != w.job_id) busy_with[rank] = ws->job_id();
  });
  absl::MutexLock l(&core_.mu());
  std::vector<std::string> stopping;
  for (uint32_t rank = 0; rank < n; ++rank) {
    if (busy_with[rank].empty()) continue;
    const JobRecord* other = core_.jobs().Find(busy_with[rank]);
    // Only a job this scheduler has ended: its task is on its way out. Anything else is a real
    // conflict, which AssignTask reports.
    if (other == nullptr || !IsTerminal(other->job.state())) continue;
    stopping.push_back(absl::StrCat(w.workers[rank], " (", busy_with[rank], ")"));
  }
  if (stopping.empty()) return false;
  JobRecord* rec = core_.jobs().Find(w.job_id);
  if (rec == nullptr || rec->job.state() != v1::JOB_PLACING) return true;
  // Nothing was called yet: back to the queue, the attempt not counted.
  v1::Job& job = rec->job;
  std::string reason =
      absl::StrCat("waiting for resources: ", stopping.size() == 1 ? "worker " : "workers ",
                   absl::StrJoin(stopping, ", "), " still stopping the task of a job that ended");
  if (reason != job.reason()) Log()->info("job {}: {}", w.job_id, reason);
  job.set_state(v1::JOB_QUEUED);
  job.set_reason(reason);
  job.clear_servers();
  job.clear_workers();
  rec->next_attempt = core_.clock().Now() + kStoppingRetry;
  // Nothing is called either way; a failed write is the sticky store error (logged).
  if (!core_.jobs().Persist(*rec).ok()) return true;
  return true;
}

void PlacementPass::ExecutePlacement(const PlacementWork& w) {
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
    absl::Status s = core_.rpc().UpdateShardMap(ep.address(), req);
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
      auto status = core_.registry().Get(node);
      if (!status.has_value() || !IsLive(*status)) {
        worker_status[rank] =
            absl::UnavailableError(absl::StrCat("worker ", node, " is no longer alive"));
        return;
      }
      const std::string& addr = status->info().address();
      v1::AssignTaskRequest req = TaskFor(w.job_id, w.spec, w.map, rank, n, w.recovery);
      absl::Status s = core_.rpc().AssignTask(addr, req);
      if (s.code() == absl::StatusCode::kFailedPrecondition) {
        // Busy: fine if it already runs this very task (we restarted mid-placement).
        auto ws = core_.rpc().WorkerStatus(addr);
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
    absl::MutexLock l(&core_.mu());
    JobRecord* rec = core_.jobs().Find(w.job_id);
    if (rec == nullptr) return;
    v1::Job& job = rec->job;
    if (job.state() != v1::JOB_PLACING) {
      // Cancelled or re-queued while we placed it.
      roll_back = true;
      why = job.reason();
    } else if (failure.ok()) {
      job.set_state(v1::JOB_RUNNING);
      job.set_started_unix_ms(UnixMs(core_.clock().Now()));
      job.clear_reason();
      rec->placement_attempts = 0;
      // Not written: the store's recovery reloads it as PLACING and places it again.
      if (!core_.jobs().Persist(*rec).ok()) return;
      Log()->info("job {} running", w.job_id);
      core_.MaybeSucceed(*rec);
    } else {
      ++rec->placement_attempts;
      Log()->warn("job {}: placement attempt {} failed: {}", w.job_id, rec->placement_attempts,
                  failure);
      why = absl::StrCat("placement failed: ", failure.message());
      roll_back = true;
      if (rec->placement_attempts >= core_.options().max_placement_attempts) {
        // core_.Finish() queues StopTask / DropJob for every node of the job.
        roll_back = false;
        core_.Finish(*rec, v1::JOB_FAILED,
                     absl::StrCat(why, " (gave up after ", rec->placement_attempts, " attempts)"));
      } else {
        job.set_state(v1::JOB_QUEUED);
        job.set_reason(absl::StrCat(why, " (attempt ", rec->placement_attempts, " of ",
                                    core_.options().max_placement_attempts, "; retrying)"));
        job.clear_servers();
        job.clear_workers();
        rec->next_attempt = core_.clock().Now() + core_.options().placement_backoff;
        if (!core_.jobs().Persist(*rec).ok()) return;  // Not written: nothing rolled back either.
      }
    }
  }
  if (roll_back) core_.RollBack(w.job_id, reached_servers, reached_workers, why);
}

std::unique_ptr<Pass> MakePlacementPass(SchedulerCore& core) {
  return std::make_unique<PlacementPass>(core);
}

}  // namespace pscluster::scheduler
