// PsHandler's side of replication: which backups each shard has under a map, the copies a map
// creates or seeds, forwarding a primary's pushes to its backups, and applying what a primary
// forwards (Replicate) to this server's copy.
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
#include "common/sharding.h"
#include "common/validate_enums.h"
#include "server/validate.h"

namespace pscluster {

std::shared_ptr<PsHandler::Replication> PsHandler::FindReplication(
    const std::string& job_id) const {
  absl::ReaderMutexLock l(&mu_);
  auto it = replication_.find(job_id);
  return it == replication_.end() ? nullptr : it->second;
}

std::shared_ptr<PsHandler::Replication> PsHandler::PlanReplication(const v1::ShardMap& map,
                                                                   const std::string& self) {
  auto rep = std::make_shared<Replication>();
  rep->forwarding.rep = rep.get();
  rep->epoch = map.epoch();
  rep->self = self;
  absl::flat_hash_map<std::string, std::string> address;
  for (const auto& ep : map.servers()) address[ep.node_id()] = ep.address();
  rep->backups.resize(map.num_virtual_shards());
  for (const auto& a : map.assignments()) {
    if (a.shard() >= map.num_virtual_shards()) continue;
    if (a.primary() == self) {
      for (const std::string& b : a.backups()) {
        const std::string& addr = address[b];
        rep->backups[a.shard()].push_back(addr);
        if (std::find(rep->backup_servers.begin(), rep->backup_servers.end(), addr) ==
            rep->backup_servers.end()) {
          rep->backup_servers.push_back(addr);
        }
      }
    } else if (std::find(a.backups().begin(), a.backups().end(), self) != a.backups().end()) {
      auto& held = rep->replica_shards[a.primary()];
      held.resize(map.num_virtual_shards());
      held[a.shard()] = true;
    }
  }
  return rep;
}

absl::Status PsHandler::CreateReplicas(const Job& job, const v1::UpdateShardMapRequest& req,
                                       Replication* rep) {
  for (const auto& [primary, held] : rep->replica_shards) {
    auto seed = std::find_if(req.copy_from().begin(), req.copy_from().end(),
                             [&](const v1::ReplicaSeed& s) { return s.primary() == primary; });
    if (seed != req.copy_from().end() && !seed->held_from().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "copy_from (", primary, ").held_from: job '", job.id(),
          "' is new on this server, which holds no copy of ", seed->held_from(), "'s shards"));
    }
    if (seed != req.copy_from().end() && seed->live()) {
      auto copy = NewCopy(job, held, req.map().epoch(), req.min_attempt());
      if (!copy.ok()) return copy.status();
      rep->replicas[primary] = std::move(*copy);
      rep->seeds[primary] = std::make_shared<JobReplication::Seed>();
      continue;
    }
    if (seed != req.copy_from().end()) {
      auto copy = SeedReplica(job, held, req.map().epoch(), req.min_attempt(), primary,
                              seed->path());
      if (!copy.ok()) return copy.status();
      rep->replicas[primary] = std::move(*copy);
      continue;
    }
    auto copy = NewCopy(job, held, req.map().epoch(), req.min_attempt());
    if (!copy.ok()) return copy.status();
    if (!req.restore_from().empty() || req.restore_step() > 0) {
      absl::Status s = RestoreForRecovery(**copy, req);
      if (!s.ok()) return s;
    }
    rep->replicas[primary] = std::move(*copy);
  }
  if (!rep->replica_shards.empty()) {
    Logger("server")->info("job '{}': copies of {} primary server(s)' shards held here",
                           job.id(), rep->replica_shards.size());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Job>> PsHandler::NewCopy(const Job& job,
                                                        const std::vector<bool>& held,
                                                        uint64_t epoch, uint32_t min_attempt) {
  std::vector<v1::TableSpec> specs;
  std::vector<OptimizerParams> optimizers;
  job.Declared(&specs, &optimizers);
  JobConfig c = job.config();
  c.checkpoint_every_steps = 0;  // The primary checkpoints its shards.
  auto copy = std::make_shared<Job>(std::move(c), &budget_, clock_, options_.limits);
  absl::Status s = copy->SetShards(epoch, held);
  if (!s.ok()) return s;
  auto created = copy->AddTables(specs, optimizers);
  if (!created.ok()) return created.status();
  copy->FenceAll(min_attempt);
  for (uint32_t w : job.LeftWorkers()) (void)copy->Leave(w);
  return copy;
}

absl::StatusOr<std::shared_ptr<Job>> PsHandler::SeedReplica(
    const Job& job, const std::vector<bool>& held, uint64_t epoch, uint32_t min_attempt,
    const std::string& primary, const std::string& path) {
  auto made = NewCopy(job, held, epoch, min_attempt);
  if (!made.ok()) return made.status();
  std::shared_ptr<Job> copy = std::move(*made);
  auto file = OpenCheckpointFile(fs(), path);  // Read a piece at a time.
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("copy_from (", primary, "): ", file.status().message()));
  }
  auto r = copy->Restore(**file, path);
  if (!r.ok()) return r.status();
  Logger("server")->info("job '{}': new copy of {}'s shards from {} (step {})", job.id(), primary,
                         path, r->first);
  return copy;
}

absl::Status PsHandler::PlanAdoptions(const Job& job, const Replication& old,
                                      const std::vector<bool>& held, uint64_t epoch,
                                      Replication* next,
                                      std::vector<Job::MapChange::Adoption>* adopt) {
  for (const auto& [primary, copy] : old.replicas) {
    auto kept = next->replica_shards.find(primary);
    auto seed = old.seeds.find(primary);
    // Shards of the copy that this server now holds as primary: the copy takes over.
    const std::vector<bool>& shards = old.replica_shards.at(primary);
    bool promoted = false;
    for (uint32_t s = 0; s < shards.size() && s < held.size(); ++s) {
      promoted = promoted || (shards[s] && held[s]);
    }
    const bool keeps = kept != next->replica_shards.end() && next->replicas.count(primary) == 0;
    if (keeps) {
      next->replicas[primary] = copy;  // Still backing that primary (its other shards).
      if (seed != old.seeds.end()) next->seeds[primary] = seed->second;
    }
    if (!promoted) continue;  // Kept as it is, or dropped with the old replication.
    if (seed != old.seeds.end()) {
      bool done = false, held = false;
      {
        absl::MutexLock l(&seed->second->mu);
        done = seed->second->done;
        held = seed->second->held.has_value();
      }
      if (!done && held) {
        // Its primary's clocks never came, so that primary acknowledged nothing under its map
        // (they are queued ahead of every update it applies, and a push is acknowledged only
        // once its backups have everything queued): the copy held here is the whole shard.
        absl::Status s = LoadHeldCopy(*copy, *seed->second, nullptr);
        if (!s.ok()) return s;
      } else if (!done) {
        return absl::FailedPreconditionError(absl::StrCat(
            "map: job '", job.id(), "': the copy of ", primary,
            "'s shards here has not received its snapshot yet and cannot take over"));
      }
    }
    // A copy that goes on backing the primary's other shards is not sealed: their updates keep
    // coming (the moved shard's stopped: its old primary took the map first).
    auto snap = copy->SnapshotForCopy(next->self, absl::ToUnixMillis(clock_->Now()), !keeps);
    if (!snap.ok()) return snap.status();
    // The clocks of what the primary applied before this map: a copy kept for its other shards
    // may already have their chunks (and step ends) of this map (ClockStateBefore).
    Job::ClockState cs = copy->ClockStateBefore(epoch);
    adopt->push_back(Job::MapChange::Adoption{std::move(*snap), std::move(cs.clocks),
                                              std::move(cs.applied),
                                              absl::StrCat("copy of ", primary, "'s shards")});
  }
  return absl::OkStatus();
}

void PsHandler::StartQueues(Replication* rep, const Replication* old) {
  std::shared_ptr<BackupTransport> transport;
  {
    absl::MutexLock l(&mu_);
    transport = backup_transport_;
  }
  if (transport == nullptr) return;
  for (const std::string& address : rep->backup_servers) {
    if (old != nullptr) {
      auto it = old->queues.find(address);
      if (it != old->queues.end()) {
        // One queue per backup across maps, so that its order (and the barriers of end-of-step
        // markers and snapshots) holds across a map change. A broken one stays broken: a backup
        // that missed copies must not be promoted later.
        rep->queues[address] = it->second;
        continue;
      }
    }
    rep->queues[address] =
        std::make_shared<BackupQueue>(address, transport, options_.replication_retry);
  }
}

absl::Status PsHandler::ForwardToBackups(const Replication& rep, const v1::PushChunk& chunk,
                                         const Payload& values, const PushResult& applied) {
  const uint32_t shard = applied.shard;
  // The chunk is queued (or refused) below: map changes wait for that, not for the flush.
  absl::Cleanup handed_over = [&] { applied.forwarding->End(); };
  if (rep.queues.size() != rep.backup_servers.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", chunk.tag().job_id(), "': this server cannot reach its shards' backups"));
  }
  const std::string& self = rep.self;
  // Queued in apply order, sent by each backup's queue while this thread goes on; the push's
  // last chunk waits until every backup has everything before it is acknowledged.
  auto send = [&](const std::string& address, v1::ReplicateRequest req,
                  const Payload& payload = Payload()) {
    rep.queues.at(address)->Enqueue(std::move(req), payload);
    return absl::OkStatus();
  };
  if (applied.applied && shard < rep.backups.size() && !rep.backups[shard].empty() &&
      values.size() > 0) {
    v1::ReplicateRequest req;
    req.set_primary(self);
    v1::PushChunk* c = req.mutable_chunk();
    *c = chunk;
    c->clear_values();
    c->clear_pull_after();
    c->clear_pull_clock();
    c->clear_step_final();
    c->clear_end_of_step();
    c->set_row_decisions(applied.row_decisions);
    for (const std::string& b : rep.backups[shard]) {
      absl::Status s = send(b, req, values);
      if (!s.ok()) return s;
    }
  }
  if (chunk.end_of_step()) {
    v1::ReplicateRequest req;
    req.set_primary(self);
    v1::PushChunk* c = req.mutable_chunk();
    *c->mutable_tag() = chunk.tag();
    c->set_epoch(chunk.epoch());
    c->set_last(true);
    c->set_end_of_step(true);
    for (const std::string& b : rep.backup_servers) {
      absl::Status s = send(b, req);
      if (!s.ok()) return s;
    }
  }
  std::move(handed_over).Invoke();
  if (chunk.last() || chunk.end_of_step()) {
    for (const auto& [address, queue] : rep.queues) {
      absl::Status s = queue->Flush(options_.replication_retry + kReplicationFlushSlack);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status PsHandler::Replicate(const v1::ReplicateRequest& req, v1::ReplicateResponse* resp) {
  const bool seed_part = !req.seed().empty() || req.seed_size() != 0 || req.has_clocks();
  v1::PushChunk chunk = req.chunk();
  Payload values = Payload::FromString(std::move(*chunk.mutable_values()));
  chunk.clear_values();
  auto r = ApplyToCopy(req.primary(), std::move(chunk), values, seed_part ? &req : nullptr);
  if (!r.ok()) return r.status();
  resp->set_duplicate(r->duplicate);
  return absl::OkStatus();
}

absl::StatusOr<PushResult> PsHandler::ApplyToCopy(const std::string& primary,
                                                  v1::PushChunk chunk, const Payload& values,
                                                  const v1::ReplicateRequest* seed_part) {
  const std::string& job_id = chunk.tag().job_id();
  if (job_id.empty()) return absl::InvalidArgumentError("chunk.tag.job_id: empty job id");
  std::shared_ptr<Replication> rep = FindReplication(job_id);
  std::shared_ptr<Job> copy;
  if (rep != nullptr) {
    auto it = rep->replicas.find(primary);
    if (it != rep->replicas.end()) copy = it->second;
  }
  if (copy == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "primary: this server holds no copy of job '", job_id, "' shards of '", primary, "'"));
  }
  std::shared_ptr<JobReplication::Seed> seed;
  if (auto it = rep->seeds.find(primary); it != rep->seeds.end()) seed = it->second;
  if (seed_part != nullptr) {
    if (seed == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          seed_part->has_clocks() ? "clocks" : "seed", ": the copy of job '", job_id,
          "' shards of '", primary, "' here is not a live copy waiting for ",
          seed_part->has_clocks() ? "its primary's clocks" : "a snapshot"));
    }
    bool held = false;
    {
      absl::MutexLock l(&seed->mu);
      held = seed->from_held;
    }
    if (!seed_part->has_clocks() && held) {
      return absl::FailedPreconditionError(absl::StrCat(
          "seed: the copy of job '", job_id, "' shards of '", primary,
          "' here holds the shards' values already and waits for its primary's clocks, not a "
          "snapshot"));
    }
    if (seed_part->has_clocks()) {
      auto clocks = Job::ClocksFromProto(seed_part->clocks(), copy->config().num_workers);
      if (!clocks.ok()) return clocks.status();
      absl::Status s = held ? LoadHeldCopy(*copy, *seed, &*clocks)
                            : TakeClocksAfterSnapshot(*copy, *seed, *clocks);
      if (!s.ok()) return s;
      return PushResult();
    }
    absl::Status s = ReceiveSeed(*seed_part, *copy, *seed);
    if (!s.ok()) return s;
    return PushResult();
  }
  if (seed != nullptr) {
    absl::MutexLock l(&seed->mu);
    // A copy that takes its new shards from one held here applies the updates of its other
    // shards until its primary's clocks come (none of the new shards' can come before them).
    if (!seed->done && !seed->held.has_value()) {
      // The primary queued this chunk before the snapshot (its queue sends a snapshot only after
      // everything queued before it arrived): the snapshot holds it. This happens when a server
      // that already backed the primary's other shards copies them afresh (a shard of another
      // primary moved to it): chunks still in flight from before its map change.
      PushResult covered;
      covered.duplicate = true;
      return covered;
    }
  }
  copy->NoteSourceEpoch(chunk.epoch());
  chunk.set_epoch(copy->epoch());  // The primary checked the worker's epoch.
  chunk.clear_replica_of();
  return copy->Push(chunk, values);
}

absl::Status PsHandler::ReceiveSeed(const v1::ReplicateRequest& req, Job& copy,
                                    JobReplication::Seed& seed) {
  absl::MutexLock l(&seed.mu);
  const uint64_t end = req.seed_offset() + req.seed().size();
  if (seed.done) return absl::OkStatus();  // A repeat of a part already loaded.
  if (req.seed_size() == 0 || end < req.seed_offset() || end > req.seed_size() ||
      (seed.size != 0 && req.seed_size() != seed.size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seed: part at ", req.seed_offset(), " (", req.seed().size(), " bytes) does not fit a "
        "snapshot of ", req.seed_size(), " bytes", seed.size ? absl::StrCat(" (announced: ",
                                                                           seed.size, ")")
                                                              : ""));
  }
  if (req.seed_offset() < seed.received) return absl::OkStatus();  // A repeat.
  if (req.seed_offset() > seed.received) {
    return absl::FailedPreconditionError(absl::StrCat("seed: part at ", req.seed_offset(),
                                                      " arrived before the part at ",
                                                      seed.received));
  }
  const std::string from = absl::StrCat("snapshot of ", req.primary(), "'s shards");
  if (seed.size == 0) {
    // A copy whose tables have a disk tier may be far larger than memory: its snapshot goes to
    // a spool file as it arrives, and is loaded from there a piece at a time.
    const std::string spool_dir = copy.SpoolDir();
    if (!spool_dir.empty()) {
      auto spool = SpoolFile::Create(spool_dir, from);
      if (!spool.ok()) {
        Logger("server")->warn("job '{}': live copy: {}", copy.id(), spool.status().message());
        return spool.status();
      }
      seed.spool = std::move(*spool);
    } else {
      seed.bytes.reserve(req.seed_size());
    }
    seed.size = req.seed_size();
  }
  if (seed.spool != nullptr) {
    absl::Status appended = seed.spool->Append(req.seed());
    if (!appended.ok()) {
      // Nothing of this part counts: a retry of it starts at the same offset (the file's
      // size moved only if the whole part went in).
      Logger("server")->warn("job '{}': live copy: {}", copy.id(), appended.message());
      return appended;
    }
  } else {
    seed.bytes.append(req.seed());
  }
  seed.received += req.seed().size();
  if (seed.received < seed.size) return absl::OkStatus();
  std::unique_ptr<CheckpointSource> source;
  if (seed.spool != nullptr) {
    source = std::make_unique<SpoolCheckpointSource>(seed.spool);
  } else {
    source = std::make_unique<StringCheckpointSource>(seed.bytes);
  }
  // Restore verifies the whole snapshot first (a spooled one is read once for that, once to
  // load); the clocks then come from its header alone.
  absl::StatusOr<std::pair<int64_t, uint32_t>> r = copy.Restore(*source, from);
  std::vector<int64_t> clocks;
  if (r.ok()) {
    auto header = ReadCheckpointHeader(*source, from);
    if (header.ok()) {
      for (const auto& wc : header->clocks()) {
        if (wc.worker() >= clocks.size()) clocks.resize(wc.worker() + 1, 0);
        clocks[wc.worker()] = wc.clock();
      }
    } else {
      r = header.status();
    }
  }
  source.reset();
  const bool spooled = seed.spool != nullptr;
  seed.bytes = std::string();
  seed.spool.reset();
  seed.received = 0;
  if (!r.ok()) {
    seed.size = 0;
    return r.status();
  }
  seed.clocks = std::move(clocks);
  seed.done = true;
  Logger("server")->info("job '{}': live copy of {}'s shards seeded (step {}, a snapshot of {} "
                         "bytes{})", copy.id(), req.primary(), r->first, seed.size,
                         spooled ? ", spooled to disk" : "");
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Job>> PsHandler::CopyFromHeld(
    const Job& job, const Replication* old, const v1::UpdateShardMapRequest& req,
    const std::string& primary, const std::vector<bool>& shards,
    std::shared_ptr<JobReplication::Seed>* made) {
  auto spec = std::find_if(req.copy_from().begin(), req.copy_from().end(),
                           [&](const v1::ReplicaSeed& s) { return s.primary() == primary; });
  const std::string& from = spec->held_from();
  const std::string field = absl::StrCat("copy_from (", primary, ").held_from");
  auto waiting = [&](const std::string& p) {
    auto it = old->seeds.find(p);
    if (it == old->seeds.end()) return false;
    absl::MutexLock l(&it->second->mu);
    return !it->second->done;
  };
  if (old == nullptr || old->replicas.count(from) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(field, ": this server holds no copy of job '",
                                                      job.id(), "' shards of '", from, "'"));
  }
  if (waiting(from)) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": this server's copy of ", from, "'s shards has not received its snapshot yet"));
  }
  const std::shared_ptr<Job>& source = old->replicas.at(from);
  const std::vector<bool>& in_source = old->replica_shards.at(from);
  // The copy kept for the primary's other shards, if any: it goes on, with the new ones added.
  std::shared_ptr<Job> kept;
  const std::vector<bool>* had = nullptr;
  if (auto it = old->replicas.find(primary); it != old->replicas.end()) {
    if (waiting(primary)) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ": this server's copy of ", primary,
          "'s shards has not received its snapshot yet"));
    }
    kept = it->second;
    had = &old->replica_shards.at(primary);
  }
  std::vector<bool> fresh(shards.size(), false);
  for (uint32_t sh = 0; sh < shards.size(); ++sh) {
    fresh[sh] = shards[sh] && !(had != nullptr && sh < had->size() && (*had)[sh]);
    if (fresh[sh] && !(sh < in_source.size() && in_source[sh])) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ": virtual shard ", sh, ", which this server starts backing under ", primary,
          ", is not in its copy of ", from, "'s shards"));
    }
  }
  // The old primary handed everything over before this map reached this server: the values of
  // those shards here are final.
  auto snap = source->CheckpointShards(req.self(), absl::ToUnixMillis(clock_->Now()), fresh);
  if (!snap.ok()) return snap.status();
  auto seed = std::make_shared<JobReplication::Seed>();
  {
    absl::MutexLock l(&seed->mu);
    seed->held = std::move(*snap);
    seed->held_before = source->ClockStateBefore(req.map().epoch());
    seed->held_from = from;
    seed->from_held = true;
  }
  *made = std::move(seed);
  if (kept != nullptr) return kept;  // Its shards grow with the map (SettleOldReplication).
  auto copy = NewCopy(job, shards, req.map().epoch(), req.min_attempt());
  // Its clocks are its primary's, which come with them (or, taking over first, those of the
  // copy the shards came from).
  if (copy.ok()) (*copy)->ClocksUnknown();
  return copy;
}

absl::Status PsHandler::TakeClocksAfterSnapshot(Job& copy, JobReplication::Seed& seed,
                                                const Job::ClockState& primary_clocks) {
  absl::MutexLock l(&seed.mu);
  if (!seed.done) {
    return absl::FailedPreconditionError(absl::StrCat(
        "clocks: the copy of job '", copy.id(), "' here has not received its snapshot yet"));
  }
  if (seed.exact) return absl::OkStatus();  // A repeat (nothing is sent after it until it lands).
  copy.SetClockState(primary_clocks);
  seed.clocks.clear();  // Exact: caught up at once.
  seed.exact = true;
  return absl::OkStatus();
}

absl::Status PsHandler::LoadHeldCopy(Job& copy, JobReplication::Seed& seed,
                                     const Job::ClockState* primary_clocks) {
  absl::MutexLock l(&seed.mu);
  if (seed.done) return absl::OkStatus();  // A repeat.
  if (!seed.held.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "clocks: the copy of job '", copy.id(), "' here holds no shards to take"));
  }
  const std::string from = absl::StrCat("copy of ", seed.held_from, "'s shards");
  if (primary_clocks != nullptr) {
    auto r = copy.Restore(*SourceOf(*seed.held), from, /*set_clocks=*/false);
    if (!r.ok()) return r.status();
    copy.SetClockState(*primary_clocks);
  } else {
    absl::Status s = copy.AdoptReplica(*seed.held, seed.held_before, from);
    if (!s.ok()) return s;
  }
  Logger("server")->info("job '{}': copy took its new shards from the {} here ({}, {} bytes)",
                         copy.id(), from,
                         primary_clocks != nullptr ? "with its primary's clocks"
                                                   : "taking over before its primary's clocks",
                         seed.held->size);
  seed.held.reset();
  seed.held_before = Job::ClockState();
  seed.clocks.clear();  // Exact clocks: caught up at once.
  seed.done = true;
  seed.exact = primary_clocks != nullptr;
  return absl::OkStatus();
}

absl::Status PsHandler::SettleOldReplication(const v1::ShardMap& map, const Replication& old,
                                             const Replication& next,
                                             const absl::flat_hash_set<std::string>& holding) {
  absl::Status result;
  // A backup dropped from the map that stays one of the job's servers (a shard moved there,
  // or away from here) gets what was applied here before the change before this returns, so
  // that when it takes the copy over it has every chunk applied here (a lost server is not
  // waited for).
  // So does one kept as a backup of this server's other shards that no longer backs a shard
  // here (that shard's primary moved to it, or its copy moved away).
  absl::flat_hash_set<std::string> in_map;
  for (const auto& ep : map.servers()) in_map.insert(ep.address());
  auto backs_fewer = [&](const std::string& address) {
    for (size_t sh = 0; sh < old.backups.size(); ++sh) {
      const auto& before = old.backups[sh];
      if (std::find(before.begin(), before.end(), address) == before.end()) continue;
      if (sh >= next.backups.size() ||
          std::find(next.backups[sh].begin(), next.backups[sh].end(), address) ==
              next.backups[sh].end()) {
        return true;
      }
    }
    return false;
  };
  for (const auto& [address, queue] : old.queues) {
    if (!in_map.contains(address)) continue;
    if (next.queues.count(address) != 0 && !backs_fewer(address)) continue;
    absl::Status f = queue->Flush(options_.replication_retry + kReplicationFlushSlack);
    if (!f.ok()) {
      Logger("server")->warn("job '{}': copies to the dropped backup at {} not all delivered: "
                             "{}", map.job_id(), address, f.message());
      if (holding.contains(address) && result.ok()) {
        // It would take the shard over from a copy that lacks updates applied here.
        result = absl::UnavailableError(absl::StrCat(
            "map: job '", map.job_id(), "': the backup at ", address,
            " keeps its copy of a shard that moved from here but did not receive everything "
            "applied here: ", f.message()));
      }
    }
  }

  // A copy kept for a primary's other shards drops the ones it no longer backs.
  for (const auto& [primary, copy] : next.replicas) {
    auto was = old.replicas.find(primary);
    if (was == old.replicas.end() || was->second != copy) continue;
    const std::vector<bool>& before = old.replica_shards.at(primary);
    const std::vector<bool>& now = next.replica_shards.at(primary);
    if (before == now) continue;
    absl::Status shrunk = copy->SetShards(map.epoch(), now);
    if (!shrunk.ok()) {
      Logger("server")->warn("job '{}': the copy of {}'s shards kept its dropped shards: {}",
                             map.job_id(), primary, shrunk.message());
    }
  }
  return result;
}

}  // namespace pscluster
