// PsHandler: the control plane (CreateTables, UpdateShardMap, FenceWorker, DropJob), the data
// plane's entry points and the server's status. Replication to backups is in
// ps_handler_replication.cc, checkpoints, restores and exports in ps_handler_checkpoint.cc.
#include "server/ps_handler.h"

#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <optional>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/path_root.h"
#include "common/sharding.h"
#include "common/validate_enums.h"
#include "server/validate.h"

namespace pscluster {
namespace {

constexpr absl::Duration kRateWindow = absl::Seconds(10);

}  // namespace

PsHandler::PsHandler(PsHandlerOptions options, const Clock* clock, Runner background)
    : options_(std::move(options)),
      clock_(clock),
      background_(std::move(background)),
      started_(clock->Now()),
      budget_(options_.memory_bytes) {
  absl::MutexLock l(&mu_);
  last_tick_ = started_;
}

PsHandler::~PsHandler() = default;

void PsHandler::set_node_id(const std::string& id) {
  absl::MutexLock l(&mu_);
  node_id_ = id;
}

void PsHandler::set_address(const std::string& address) {
  absl::MutexLock l(&mu_);
  address_ = address;
}

void PsHandler::set_data_port(uint32_t port) {
  absl::MutexLock l(&mu_);
  data_port_ = port;
}

void PsHandler::set_data_unix(std::string name) {
  absl::MutexLock l(&mu_);
  data_unix_ = std::move(name);
}

std::string PsHandler::node_id() const {
  absl::MutexLock l(&mu_);
  return node_id_;
}

void PsHandler::set_backup_transport(std::shared_ptr<BackupTransport> transport) {
  absl::MutexLock l(&mu_);
  backup_transport_ = std::move(transport);
}

absl::StatusOr<std::shared_ptr<Job>> PsHandler::FindJob(absl::string_view job_id,
                                                        absl::string_view field) const {
  if (job_id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty job id"));
  absl::ReaderMutexLock l(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat(field, ": unknown job '", job_id,
                                            "' on this server (CreateTables first)"));
  }
  return it->second;
}

// ------------------------------------------------------------------ control plane

absl::Status PsHandler::CreateTables(const v1::CreateTablesRequest& req,
                                     v1::CreateTablesResponse* resp) {
  if (!req.checkpoint_dir().empty()) {
    absl::Status in_root =
        CheckUnderRoot(req.checkpoint_dir(), options_.checkpoint_root, "checkpoint_dir");
    if (!in_root.ok()) return in_root;
  }
  std::vector<v1::TableSpec> specs;
  std::vector<OptimizerParams> optimizers;
  absl::Status s = ValidateCreateTables(req, &specs, &optimizers);
  if (!s.ok()) return s;
  auto same_config = [&](const JobConfig& c) -> absl::Status {
    uint32_t shards = req.num_virtual_shards() ? req.num_virtual_shards() : c.num_shards;
    if (c.num_workers != req.num_workers() || shards != c.num_shards ||
        c.consistency.SerializeAsString() != req.consistency().SerializeAsString()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "consistency: job '", req.job_id(),
          "' already exists with different consistency, num_workers or num_virtual_shards"));
    }
    return absl::OkStatus();
  };
  std::shared_ptr<Job> job;
  std::optional<v1::UpdateShardMapRequest> pending;
  {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(req.job_id());
    if (it != jobs_.end()) {
      job = it->second;
    } else {
      auto pm = pending_maps_.find(req.job_id());
      if (pm != pending_maps_.end()) pending = pm->second;
    }
  }
  if (job == nullptr) {
    // Build the new job outside the lock (initialising tables may take a while); if another
    // CreateTables of the same job wins the race, its job is used below instead.
    JobConfig c;
    c.job_id = req.job_id();
    c.consistency = req.consistency();
    c.num_workers = req.num_workers();
    c.checkpoint_every_steps = req.checkpoint_every_steps();
    c.checkpoint_dir = req.checkpoint_dir();
    c.spill_dir = options_.spill_dir;
    const uint32_t map_shards = pending ? pending->map().num_virtual_shards() : 0;
    c.num_shards = req.num_virtual_shards() ? req.num_virtual_shards()
                                            : (map_shards ? map_shards : kDefaultVirtualShards);
    if (map_shards != 0 && map_shards != c.num_shards) {
      return absl::InvalidArgumentError(absl::StrCat(
          "num_virtual_shards: ", c.num_shards, " differs from the installed shard map's ",
          map_shards));
    }
    auto fresh = std::make_shared<Job>(std::move(c), &budget_, clock_, options_.limits);
    if (pending) {
      const v1::ShardMap& map = pending->map();
      std::vector<bool> held(map.num_virtual_shards());
      for (const auto& a : map.assignments()) held[a.shard()] = a.primary() == pending->self();
      s = fresh->SetShards(map.epoch(), std::move(held));
      if (!s.ok()) return s;
      fresh->FenceAll(pending->min_attempt());
      const bool joins_live = std::any_of(pending->copy_from().begin(),
                                          pending->copy_from().end(),
                                          [](const v1::ReplicaSeed& s) { return s.live(); });
      if (joins_live && pending->restore_from().empty() && pending->restore_step() == 0) {
        fresh->ClocksUnknown();  // Joining a running job: the ranks are somewhere past 0.
      }
    }
    auto created = fresh->AddTables(specs, optimizers);
    if (!created.ok()) return created.status();
    if (pending && (!pending->restore_from().empty() || pending->restore_step() > 0)) {
      // A recovering job: its shards come from the checkpoints before any worker can read.
      s = RestoreForRecovery(*fresh, *pending);
      if (!s.ok()) return s;
    }
    std::shared_ptr<Replication> rep;
    if (pending) {
      rep = PlanReplication(pending->map(), pending->self());
      s = CreateReplicas(*fresh, *pending, rep.get());
      if (!s.ok()) return s;
      StartQueues(rep.get());
      fresh->SetForwarding(ForwardingOf(rep));
    }
    {
      absl::MutexLock l(&mu_);
      auto it = jobs_.find(req.job_id());
      if (it == jobs_.end()) {
        jobs_[req.job_id()] = fresh;
        if (rep != nullptr) replication_[req.job_id()] = rep;
        auto pm = pending_maps_.find(req.job_id());
        if (pm != pending_maps_.end() && pm->second.map().epoch() <= fresh->epoch()) {
          pending_maps_.erase(pm);
        }
        resp->set_created(*created);
        Logger("server")->info("job '{}': {} tables created ({} workers, {} virtual shards)",
                               req.job_id(), *created, req.num_workers(),
                               fresh->config().num_shards);
        return absl::OkStatus();
      }
      job = it->second;  // Lost the race.
    }
  }
  s = same_config(job->config());
  if (!s.ok()) return s;
  auto created = job->AddTables(specs, optimizers);
  if (!created.ok()) return created.status();
  resp->set_created(*created);
  return absl::OkStatus();
}

absl::Status PsHandler::UpdateShardMap(const v1::UpdateShardMapRequest& req,
                                       v1::UpdateShardMapResponse* resp) {
  absl::Status s = ValidateShardMap(req.map(), "map");
  if (!s.ok()) return s;
  if (req.self().empty()) {
    return absl::InvalidArgumentError("self: the receiving server's node_id is required");
  }
  if (req.restore_step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("restore_step: ", req.restore_step(),
                                                   " is negative"));
  }
  for (int i = 0; i < req.restore_from_size(); ++i) {
    if (req.restore_from(i).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("restore_from[", i, "]: empty path"));
    }
    s = CheckUnderRoot(req.restore_from(i), options_.checkpoint_root,
                       absl::StrCat("restore_from[", i, "]"));
    if (!s.ok()) return s;
  }
  const v1::ShardMap& map = req.map();
  std::shared_ptr<Job> job;
  {
    absl::MutexLock l(&mu_);
    if (!node_id_.empty() && req.self() != node_id_) {
      return absl::InvalidArgumentError(absl::StrCat("self: this server is '", node_id_,
                                                     "', not '", req.self(), "'"));
    }
    if (!req.data_secret().empty()) {
      s = SetDataSecret(map.job_id(), req.data_secret());  // Lock order: mu_, secrets_mu_.
      if (!s.ok()) return s;
    }
    auto it = jobs_.find(map.job_id());
    if (it == jobs_.end()) {
      auto& pending = pending_maps_[map.job_id()];
      if (pending.map().epoch() <= map.epoch() || pending.map().job_id().empty()) pending = req;
      resp->set_epoch(pending.map().epoch());
      return absl::OkStatus();
    }
    job = it->second;
  }
  if (map.num_virtual_shards() != job->config().num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "map.num_virtual_shards: ", map.num_virtual_shards(), " differs from job '",
        map.job_id(), "' (", job->config().num_shards, ")"));
  }
  if ((!req.restore_from().empty() || req.restore_step() > 0) && map.epoch() > job->epoch()) {
    // Restoring under tables that workers may be using would mix two runs of the job.
    return absl::FailedPreconditionError(absl::StrCat(
        "restore_from: job '", map.job_id(), "' already has tables on this server (epoch ",
        job->epoch(), "); a recovery restores only into tables created after its map (DropJob "
        "first)"));
  }
  std::vector<bool> held(map.num_virtual_shards());
  for (const auto& a : map.assignments()) held[a.shard()] = a.primary() == req.self();
  const bool newer = map.epoch() > job->epoch();
  if (!newer) {
    s = job->SetShards(map.epoch(), std::move(held));
    if (!s.ok()) return s;
    job->FenceAll(req.min_attempt());
    resp->set_epoch(job->epoch());
    return absl::OkStatus();
  }
  std::shared_ptr<Replication> old = FindReplication(map.job_id());
  std::shared_ptr<Replication> next = PlanReplication(map, req.self());
  // New copies (a backup added in the middle of the run) load their primary's checkpoint, or
  // wait for its live snapshot, before anything changes here.
  for (const auto& [primary, shards] : next->replica_shards) {
    if (old != nullptr && old->replicas.count(primary) != 0) {
      // A copy kept must already hold every shard it backs up from now on.
      const std::vector<bool>& had = old->replica_shards.at(primary);
      bool grows = false;
      for (size_t i = 0; i < shards.size(); ++i) {
        grows = grows || (shards[i] && (i >= had.size() || !had[i]));
      }
      if (!grows) continue;
    }
    auto seed = std::find_if(req.copy_from().begin(), req.copy_from().end(),
                             [&](const v1::ReplicaSeed& s) { return s.primary() == primary; });
    if (seed == req.copy_from().end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "copy_from: map epoch ", map.epoch(), " makes this server a backup of ", primary,
          " in the middle of job '", map.job_id(), "' but gives no checkpoint to start from"));
    }
    if (seed->live() && !seed->held_from().empty()) {
      // Its new shards are in a copy held here already: no snapshot travels.
      std::shared_ptr<JobReplication::Seed> pending;
      auto copy = CopyFromHeld(*job, old.get(), req, primary, shards, &pending);
      if (!copy.ok()) return copy.status();
      next->replicas[primary] = std::move(*copy);
      next->seeds[primary] = std::move(pending);
      continue;
    }
    auto copy = seed->live()
                    ? NewCopy(*job, shards, map.epoch(), req.min_attempt())
                    : SeedReplica(*job, shards, map.epoch(), req.min_attempt(), primary,
                                  seed->path());
    if (!copy.ok()) return copy.status();
    next->replicas[primary] = std::move(*copy);
    if (seed->live()) next->seeds[primary] = std::make_shared<JobReplication::Seed>();
  }
  Job::MapChange change;
  if (old != nullptr) {
    s = PlanAdoptions(*job, *old, held, map.epoch(), next.get(), &change.adopt);
    if (!s.ok()) return s;
    // What this server applied as primary reaches the backups it keeps before the map changes
    // (duplicates are not sent again).
    for (const auto& [address, queue] : old->queues) {
      if (std::find(next->backup_servers.begin(), next->backup_servers.end(), address) !=
          next->backup_servers.end()) {
        (void)queue->Flush(options_.replication_retry + kReplicationFlushSlack);
      }
    }
  }
  StartQueues(next.get(), old.get());
  // Backups (by address) that keep their copies of shards moving here or from here.
  absl::flat_hash_set<std::string> holding;
  for (const std::string& node : req.backups_holding_copies()) {
    for (const auto& ep : map.servers()) {
      if (ep.node_id() == node) holding.insert(ep.address());
    }
  }
  if (req.seed_new_backups()) {
    // Servers that back a shard of this one now and did not: each gets a snapshot taken as the
    // map takes effect, queued ahead of every chunk applied after it.
    // Those that hold their new shards' copies already (backups_holding_copies) get this
    // server's clocks instead.
    std::vector<std::shared_ptr<BackupQueue>> fresh, clocks_only;
    absl::flat_hash_set<std::string> fresh_addresses;
    for (size_t sh = 0; sh < next->backups.size(); ++sh) {
      for (const std::string& address : next->backups[sh]) {
        const bool had = old != nullptr && sh < old->backups.size() &&
                         std::find(old->backups[sh].begin(), old->backups[sh].end(), address) !=
                             old->backups[sh].end();
        auto q = next->queues.find(address);
        if (had || q == next->queues.end()) continue;
        auto& to = holding.contains(address) ? clocks_only : fresh;
        if (std::find(to.begin(), to.end(), q->second) == to.end()) to.push_back(q->second);
        if (!holding.contains(address)) fresh_addresses.insert(address);
      }
    }
    // The snapshot covers every shard those servers back from here (their copy is made anew,
    // for all of them), and no other: a move of one shard sends that shard, not the job.
    change.seed_shards.assign(job->config().num_shards, false);
    for (size_t sh = 0; sh < next->backups.size() && sh < change.seed_shards.size(); ++sh) {
      for (const std::string& address : next->backups[sh]) {
        if (fresh_addresses.contains(address)) change.seed_shards[sh] = true;
      }
    }
    const std::string self = req.self();
    const std::string job_id = map.job_id();
    change.node_id = self;
    if (!fresh.empty()) {
      change.seed = [fresh, self, job_id](CheckpointSnapshot taken) {
        // Each part is read from the snapshot (in memory, or its spool file) when its turn to
        // be sent comes: parts go one at a time, so queueing the snapshot copies nothing.
        auto snap = std::make_shared<const CheckpointSnapshot>(std::move(taken));
        // Parts of 1 MiB: a part is in memory only while it is sent (read into the request,
        // serialised once); with several sender threads, each one's allocator arena may keep
        // what it held.
        constexpr uint64_t kPart = 1 << 20;
        for (uint64_t off = 0; off == 0 || off < snap->size; off += kPart) {
          v1::ReplicateRequest part;
          part.set_primary(self);
          part.mutable_chunk()->mutable_tag()->set_job_id(job_id);
          part.set_seed_offset(off);
          part.set_seed_size(snap->size);
          const size_t n = static_cast<size_t>(std::min(kPart, snap->size - off));
          for (const auto& q : fresh) {
            q->Enqueue(part, [snap, off, n](v1::ReplicateRequest& req) -> absl::Status {
              std::string* into = req.mutable_seed();
              auto piece = SourceOf(*snap)->Read(off, n, into);
              if (!piece.ok()) return piece.status();
              if (piece->data() != into->data()) into->assign(piece->data(), piece->size());
              return absl::OkStatus();
            });
          }
        }
      };
    }
    // Every new copy gets the clocks and records of applied chunks as the map takes effect
    // (after its snapshot, if any): a chunk applied here before the snapshot and pushed again
    // after a takeover is then a duplicate there too.
    std::vector<std::shared_ptr<BackupQueue>> clocked = clocks_only;
    for (const auto& q : fresh) {
      if (std::find(clocked.begin(), clocked.end(), q) == clocked.end()) clocked.push_back(q);
    }
    if (!clocked.empty()) {
      change.clocks = [clocked, self, job_id](const Job::ClockState& state) {
        v1::ReplicateRequest part;
        part.set_primary(self);
        part.mutable_chunk()->mutable_tag()->set_job_id(job_id);
        Job::ClocksToProto(state, part.mutable_clocks());
        for (const auto& q : clocked) q->Enqueue(part);
      };
    }
  }
  change.forwarding = ForwardingOf(next);
  const size_t adopted = change.adopt.size();
  s = job->SetShards(map.epoch(), std::move(held), std::move(change));
  if (!s.ok()) return s;
  // Chunks applied before the change are queued with the old forwarding: wait until they are,
  // so that the flushes below cover them.
  if (old != nullptr) old->forwarding.AwaitHandedOver();
  if (adopted > 0) {
    Logger("server")->warn("job '{}': took over {} copied shard set(s) as their primary (map "
                           "epoch {})", map.job_id(), adopted, map.epoch());
  }
  absl::Status settled;
  if (old != nullptr) settled = SettleOldReplication(map, *old, *next, holding);
  {
    absl::MutexLock l(&mu_);
    replication_[map.job_id()] = std::move(next);
  }
  job->FenceAll(req.min_attempt());
  resp->set_epoch(job->epoch());
  return settled;
}

absl::Status PsHandler::FenceWorker(const v1::FenceWorkerRequest& req,
                                    v1::FenceWorkerResponse* resp) {
  auto job = FindJob(req.job_id(), "job_id");
  if (!job.ok()) return job.status();
  if (req.worker() >= (*job)->config().num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker: rank ", req.worker(),
                                                   " is outside job '", req.job_id(), "' (",
                                                   (*job)->config().num_workers, " workers)"));
  }
  if (req.leave() && req.rejoin()) {
    return absl::InvalidArgumentError("rejoin: a rank cannot leave and rejoin in one call");
  }
  int64_t clock;
  uint32_t fence;
  // A plain fence of a rank that left comes from a scheduler that stopped half-way through the
  // rank's return (it hands the rank over as if its worker had no task): it rejoins too.
  const bool rejoin = req.rejoin() || (!req.leave() && (*job)->HasLeft(req.worker()));
  if (rejoin) {
    auto back = (*job)->Rejoin(req.worker(), req.attempt());
    if (!back.ok()) return back.status();
    clock = *back;
    fence = req.attempt();
  } else if (req.leave()) {
    // Fences every attempt, or changes nothing when it cannot be done.
    auto left = (*job)->Leave(req.worker());
    if (!left.ok()) return left.status();
    clock = *left;
    fence = std::numeric_limits<uint32_t>::max();
  } else {
    std::tie(clock, fence) = (*job)->Fence(req.worker(), req.attempt());
  }
  if (auto rep = FindReplication(req.job_id()); rep != nullptr) {
    for (auto& [primary, copy] : rep->replicas) {
      if (rejoin) {
        (void)copy->Rejoin(req.worker(), req.attempt());
        continue;
      }
      copy->Fence(req.worker(), req.attempt());
      if (req.leave()) (void)copy->Leave(req.worker());
    }
  }
  resp->set_clock(clock);
  resp->set_attempt(fence);
  if (req.leave()) {
    Logger("server")->warn("job '{}': rank {} left the job at clock {}; no step waits for it any "
                           "more", req.job_id(), req.worker(), clock);
  } else if (rejoin) {
    Logger("server")->warn("job '{}': rank {} rejoined the job at clock {} (attempt {})",
                           req.job_id(), req.worker(), clock, fence);
  } else {
    Logger("server")->info("job '{}': rank {} fenced at attempt {} (clock {})", req.job_id(),
                           req.worker(), fence, clock);
  }
  return absl::OkStatus();
}

absl::Status PsHandler::DropJob(const v1::DropJobRequest& req, v1::DropJobResponse*) {
  {
    absl::MutexLock l(&secrets_mu_);
    data_secrets_.erase(req.job_id());
  }
  std::shared_ptr<Job> job;
  {
    absl::MutexLock l(&mu_);
    pending_maps_.erase(req.job_id());
    auto it = jobs_.find(req.job_id());
    if (it == jobs_.end()) return absl::OkStatus();
    job = std::move(it->second);
    jobs_.erase(it);
    auto rep = replication_.find(req.job_id());
    if (rep != replication_.end()) {
      for (auto& [primary, copy] : rep->second->replicas) copy->Drop();
      replication_.erase(rep);
    }
  }
  job->Drop();
  Logger("server")->info("job '{}' dropped", req.job_id());
  return absl::OkStatus();
}

// ------------------------------------------------------------------ data plane

absl::StatusOr<PushResult> PsHandler::Push(const v1::PushChunk& chunk, const Payload& values) {
  absl::Status enums = ValidateEnums(chunk);
  if (!enums.ok()) return enums;
  if (!chunk.replica_of().empty()) {
    // A primary's copy over the TCP data port (BackupQueue), not a worker's push.
    return ApplyToCopy(chunk.replica_of(), chunk, values, nullptr);
  }
  if (!chunk.row_decisions().empty()) {
    return absl::InvalidArgumentError(
        "row_decisions: set only on a primary's copy of a chunk (replica_of), not by a worker");
  }
  auto job = FindJob(chunk.tag().job_id(), "tag.job_id");
  if (!job.ok()) return job.status();
  std::shared_ptr<Job> pushed_to = *job;
  auto r = pushed_to->Push(
      chunk, values, [this] { return node_id(); },
      [this, &pushed_to](int64_t at) {
        // A disk tier's periodic checkpoint: written now, streamed, before reads at the new
        // clock are served (the tables do not fit in memory twice).
        auto w = WriteCheckpoint(pushed_to, "", true, nullptr, at);
        if (!w.ok() && w.status().code() != absl::StatusCode::kNotFound) {
          Logger("server")->error("job '{}': periodic checkpoint failed: {}", pushed_to->id(),
                                  w.status());
        }
        return true;
      });
  if (!r.ok()) return r;
  if (r->forwarding != nullptr) {
    // Replication: the backups have the chunk before the worker hears it was applied. A
    // duplicate is not sent again: its first copy was queued when it was applied (and a queue
    // delivers all or breaks), or a copy seeded since holds it.
    ForwardingState* fwd = r->forwarding.get();
    absl::Status fs = fwd->rep->backup_servers.empty()
                          ? (fwd->End(), absl::OkStatus())
                          : ForwardToBackups(*fwd->rep, chunk, values, *r);
    if (!fs.ok()) return fs;
  }
  if (r->applied) {
    pushes_total_.fetch_add(1, std::memory_order_relaxed);
    bytes_in_total_.fetch_add(values.size(), std::memory_order_relaxed);
  }
  if (r->duplicate) duplicates_total_.fetch_add(1, std::memory_order_relaxed);
  if (r->checkpoint != nullptr) {
    // Taken by the push that completed the step (see Job::Push); written in the background.
    std::shared_ptr<const Job::Snapshot> snap = std::move(r->checkpoint);
    std::shared_ptr<Job> j = *job;
    background_([this, j, snap] {
      auto w = WriteCheckpoint(j, "", true, snap);
      if (!w.ok() && w.status().code() != absl::StatusCode::kNotFound) {
        Logger("server")->error("job '{}': periodic checkpoint failed: {}", j->id(), w.status());
      }
    });
  }
  return r;
}

absl::StatusOr<PsHandler::PullPlan> PsHandler::PlanPull(const v1::PullRequest& req) {
  absl::Status enums = ValidateEnums(req);
  if (!enums.ok()) return enums;
  auto job = FindJob(req.job_id(), "job_id");
  if (!job.ok()) return job.status();
  PullPlan plan;
  plan.job = *job;
  absl::Status s = plan.job->CheckReader(req.worker(), req.attempt(), req.clock(), req.dtype(),
                                         "worker", "dtype");
  if (!s.ok()) return s;
  plan.dtype = Job::TransportType(req.dtype());
  plan.slices.reserve(req.slices_size());
  for (int i = 0; i < req.slices_size(); ++i) {
    auto r = plan.job->ResolveForRead(req.slices(i), req.epoch(), absl::StrCat("slices[", i, "]"));
    if (!r.ok()) return r.status();
    plan.slices.push_back(std::move(*r));
  }
  if (req.slices_size() == 0) {
    // Still checks the epoch, so an empty pull answers whether the map is current.
    s = plan.job->CheckRequestEpoch(req.epoch());
    if (!s.ok()) return s;
  }
  return plan;
}

absl::StatusOr<PsHandler::PullPlan> PsHandler::PlanPullAfter(const v1::PushChunk& chunk) {
  auto job = FindJob(chunk.tag().job_id(), "tag.job_id");
  if (!job.ok()) return job.status();
  PullPlan plan;
  plan.job = *job;
  // An int8 push's slice comes back as float32 (int8 is for gradients only).
  const v1::DataType read_type =
      chunk.dtype() == v1::DT_INT8 ? v1::DT_FLOAT32 : chunk.dtype();
  absl::Status s = plan.job->CheckReader(chunk.tag().worker(), chunk.tag().attempt(),
                                         chunk.pull_clock(), read_type, "tag.worker", "dtype");
  if (!s.ok()) return s;
  plan.dtype = Job::TransportType(read_type);
  auto r = plan.job->ResolveForRead(chunk.slice(), chunk.epoch(), "slice");
  if (!r.ok()) return r.status();
  plan.slices.push_back(std::move(*r));
  return plan;
}

// ------------------------------------------------------------------ status

PsHandler::Totals PsHandler::CurrentTotals() const {
  Totals t;
  t.at = clock_->Now();
  t.pushes = pushes_total_.load();
  t.pulls = pulls_total_.load();
  t.bytes_in = bytes_in_total_.load();
  t.bytes_out = bytes_out_total_.load();
  return t;
}

void PsHandler::SampleRates(double* push, double* pull, double* in, double* out) {
  Totals now = CurrentTotals();
  absl::MutexLock l(&mu_);
  if (samples_.empty() || now.at - samples_.back().at >= absl::Seconds(1)) samples_.push_back(now);
  while (samples_.size() > 2 && now.at - samples_.front().at > kRateWindow) samples_.pop_front();
  const Totals& old = samples_.front();
  double dt = absl::ToDoubleSeconds(now.at - old.at);
  if (dt <= 0) {
    *push = *pull = *in = *out = 0;
    return;
  }
  *push = (now.pushes - old.pushes) / dt;
  *pull = (now.pulls - old.pulls) / dt;
  *in = (now.bytes_in - old.bytes_in) / dt;
  *out = (now.bytes_out - old.bytes_out) / dt;
}

void PsHandler::Tick(v1::Load* load, std::vector<v1::ShardLoad>* shard_loads) {
  double push, pull, in, out;
  SampleRates(&push, &pull, &in, &out);
  std::vector<std::shared_ptr<Job>> jobs, copies;
  double window;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, j] : jobs_) jobs.push_back(j);
    for (auto& [id, r] : replication_) {
      for (auto& [primary, copy] : r->replicas) copies.push_back(copy);
    }
    absl::Time now = clock_->Now();
    window = absl::ToDoubleSeconds(now - last_tick_);
    last_tick_ = now;
  }
  std::vector<v1::ShardLoad> loads;
  for (auto& j : jobs) j->TakeShardLoads(window, &loads);
  // Expired embedding rows (EmbeddingSpec) are freed here, on primaries and copies alike.
  for (auto& j : jobs) j->CollectExpired();
  for (auto& c : copies) c->CollectExpired();
  if (load != nullptr) {
    load->set_bytes_per_sec(in + out);
    load->set_requests_per_sec(push + pull);
    load->set_memory_used_bytes(budget_.used());
  }
  if (shard_loads != nullptr) *shard_loads = loads;
  absl::MutexLock l(&mu_);
  last_shard_loads_ = std::move(loads);
}

void PsHandler::FillIdentity(v1::ServerStatus* resp) const {
  resp->set_node_id(node_id_);
  resp->set_address(address_);
  resp->set_data_port(data_port_);
  resp->set_data_unix(data_unix_);
  resp->set_pid(static_cast<uint32_t>(getpid()));
}

absl::Status PsHandler::Status(const v1::ServerStatusRequest& req, v1::ServerStatus* resp) {
  if (req.brief()) {
    absl::MutexLock l(&mu_);
    FillIdentity(resp);
    return absl::OkStatus();
  }
  std::vector<std::shared_ptr<Job>> jobs;
  if (!req.job_id().empty()) {
    auto job = FindJob(req.job_id(), "job_id");
    if (!job.ok()) return job.status();
    jobs.push_back(*job);
  }
  double push, pull, in, out;
  SampleRates(&push, &pull, &in, &out);
  {
    absl::MutexLock l(&mu_);
    FillIdentity(resp);
    if (req.job_id().empty()) {
      for (auto& [id, j] : jobs_) jobs.push_back(j);
    }
    for (const auto& sl : last_shard_loads_) {
      if (req.job_id().empty() || sl.job_id() == req.job_id()) *resp->add_shard_loads() = sl;
    }
  }
  std::sort(jobs.begin(), jobs.end(),
            [](const auto& a, const auto& b) { return a->id() < b->id(); });
  resp->set_uptime_sec(absl::ToDoubleSeconds(clock_->Now() - started_));
  for (auto& j : jobs) {
    v1::JobOnServer* js = resp->add_jobs();
    j->FillStatus(js);
    std::shared_ptr<Replication> rep = FindReplication(j->id());
    if (rep == nullptr) continue;
    for (const auto& [address, queue] : rep->queues) {
      if (queue->broken()) js->add_unreachable_backups(address);
    }
    for (const auto& [primary, copy] : rep->replicas) {
      v1::ReplicaOnServer* r = js->add_replicas();
      r->set_primary(primary);
      const std::vector<bool>& shards = rep->replica_shards.at(primary);
      for (uint32_t s = 0; s < shards.size(); ++s) {
        if (shards[s]) r->add_shards(s);
      }
      Job::ClockState cs = copy->GetClockState();
      for (uint32_t w = 0; w < cs.clocks.size(); ++w) {
        v1::WorkerClock* wc = r->add_clocks();
        wc->set_worker(w);
        wc->set_clock(cs.clocks[w]);
      }
      bool seeded = true, caught_up = true;
      if (auto seed = rep->seeds.find(primary); seed != rep->seeds.end()) {
        absl::MutexLock l(&seed->second->mu);
        seeded = caught_up = seed->second->done;
        for (size_t w = 0; caught_up && w < seed->second->clocks.size(); ++w) {
          if (w < cs.left.size() && cs.left[w]) continue;  // Left the job: pushes no more.
          caught_up = w < cs.clocks.size() && cs.clocks[w] > seed->second->clocks[w];
        }
      }
      r->set_seeded(seeded);
      r->set_caught_up(caught_up);
    }
  }
  resp->set_push_per_sec(push);
  resp->set_pull_per_sec(pull);
  resp->set_bytes_in_per_sec(in);
  resp->set_bytes_out_per_sec(out);
  resp->set_pushes_total(pushes_total_.load());
  resp->set_pulls_total(pulls_total_.load());
  resp->set_duplicates_total(duplicates_total_.load());
  resp->set_bytes_in_total(bytes_in_total_.load());
  resp->set_bytes_out_total(bytes_out_total_.load());
  resp->set_queue_depth(static_cast<uint32_t>(std::max<int64_t>(0, queue_depth_.load())));
  auto sec = [this](Phase p) { return phase_ns_[static_cast<int>(p)].load() * 1e-9; };
  auto* t = resp->mutable_times();
  t->set_parse_sec(sec(Phase::kParse));
  t->set_queue_sec(sec(Phase::kQueue));
  t->set_apply_sec(sec(Phase::kApply));
  t->set_read_sec(sec(Phase::kRead));
  t->set_park_sec(sec(Phase::kPark));
  t->set_chunks_in(chunks_in_.load());
  t->set_chunks_out(chunks_out_.load());
  t->set_copies_on_write(DenseCopiesOnWrite());
  return absl::OkStatus();
}

}  // namespace pscluster
