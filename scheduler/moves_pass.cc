// Live shard moves (design section 5): MoveShard queues one (shard_move.cc), this pass carries it
// out on the moves thread with two shard maps, and the rebalancer queues moves of hot shards off
// overloaded servers.
//
//   map 1: the target backs the shard with a live copy. The target takes the map first (its
//          copy waits for a snapshot), then the primary, which snapshots its shards as the map
//          takes effect there and forwards every update it applies from then on; then the rest.
//   wait:  until the target's copy has its snapshot and its primary's clocks and records of
//          applied chunks, sent right behind it (ReplicaOnServer.caught_up): it then drops
//          exactly what the primary applied, a round that began before the snapshot included;
//          then, for pacing only, until every worker has ended a step since (PaceToAStep).
//   map 2: the target is the shard's primary. The old primary takes it first (it stops applying
//          the shard's chunks and hands the target everything it applied), then the rest; the
//          target takes its copy over atomically with the map.
// Workers never stop: a server that moved past their map refuses their round, they fetch the new
// map and send it again, and the exactly-once tags drop what already landed.
//
// With replicas (replication > 1) the job keeps its copies throughout: map 1 adds the target as
// one more backup of the shard's primary, whichever copy moves. Moving a backup, map 2 puts the
// target in its place; moving the primary, map 2 makes the target the primary, and each other
// backup of the shard keeps the copy it holds: the old primary delivers everything it applied
// to them before it answers map 2, they take the map next (their copy of the shard moves under
// the new primary), and the new primary, taking it last, sends them its clocks and records of
// applied chunks ahead of every update it applies (ReplicaSeed.held_from). No second copy
// travels, and a loss of the new primary at any point promotes one of them.
// Jobs that aggregate their pushes do not move (the buffered steps would need moving too).
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "scheduler/job_state.h"
#include "scheduler/membership.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"
#include "scheduler/recovery.h"

namespace pscluster::scheduler {
namespace {

// How often a copy's progress is looked at while it catches up.
constexpr absl::Duration kCopyPoll = absl::Milliseconds(20);

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

class MovesPass final : public Pass {
 public:
  explicit MovesPass(SchedulerCore& core) : core_(core), elastic_(MakeElasticPass(core)) {}
  const char* name() const override { return "moves"; }
  void Run() override;

 private:
  // Queues the moves the rebalancer picks for running jobs from their servers' shard loads.
  void Rebalance();
  // Moves the queued shard move of `job_id`: map 1 gives the target a live copy, map 2 (once
  // it has caught up) makes it the primary. Records the outcome in the job.
  void ExecuteMove(const std::string& job_id);
  // A switch waits for a step end: waits (on the scheduler's clock, at most
  // --move_copy_timeout_ms) until every rank still in job `job_id` has completed a step on the
  // server at `address` since this was called, or the job stops running, its map moves past
  // `epoch`, or the scheduler stops. The switch then meets the workers between two rounds, and
  // the moves of a drain or a scale leave the job a step between each other, instead of meeting
  // the workers' rounds back to back. Only pacing: the copy is exact before this is called.
  void PaceToAStep(const std::string& job_id, const std::string& address, uint64_t epoch);
  // The CreateTables a server joining the job gets: the tables as `from` (the job's server at
  // `address`) declared them. FAILED_PRECONDITION when a rank has left the job.
  absl::StatusOr<v1::CreateTablesRequest> TablesFromPrimary(const std::string& job_id,
                                                            const v1::JobSpec& spec,
                                                            const std::string& from,
                                                            const std::string& address);

  SchedulerCore& core_;
  const std::unique_ptr<Pass> elastic_;
};

}  // namespace

void MovesPass::Run() {
  bool rebalance = false;
  {
    absl::MutexLock l(&core_.mu());
    (void)core_.TakeMovesWanted();           // This run is the one wanted.
    if (!core_.jobs().error().ok()) return;  // Nothing moves until the store works again.
    const absl::Time now = core_.clock().Now();
    if (core_.options().rebalance_every > absl::ZeroDuration() && now >= core_.next_rebalance()) {
      // The first look waits a whole period: loads need a few heartbeats to mean anything.
      if (core_.next_rebalance() != absl::Time()) rebalance = true;
      core_.set_next_rebalance(now + core_.options().rebalance_every);
    }
  }
  if (rebalance) Rebalance();
  elastic_->Run();
  std::vector<std::string> queued;
  {
    absl::MutexLock l(&core_.mu());
    for (const JobRecord& each : core_.jobs()) {
      const std::string& id = each.job.job_id();
      const v1::Job& job = each.job;
      // (A COPYING one is not under way: this thread carries moves out one at a time.)
      if (!job.moves().empty() && (job.moves().rbegin()->state() == v1::MOVE_QUEUED ||
                                   job.moves().rbegin()->state() == v1::MOVE_COPYING)) {
        queued.push_back(id);
      }
    }
  }
  for (const std::string& id : queued) {
    if (!core_.store_status().ok()) return;
    ExecuteMove(id);
  }
}

void MovesPass::Rebalance() {
  const std::vector<v1::ShardLoad> loads = core_.registry().ShardLoads();
  absl::flat_hash_set<std::string> draining;  // Never a target.
  for (const v1::NodeStatus& n : core_.registry().Snapshot()) {
    if (n.drain() != v1::NODE_IN_SERVICE || n.state() != v1::NODE_ALIVE) {
      draining.insert(n.info().node_id());
    }
  }
  absl::MutexLock l(&core_.mu());
  for (JobRecord& rec : core_.jobs()) {
    const std::string& id = rec.job.job_id();
    const v1::Job& job = rec.job;
    // A change of the job's servers under way decides where its shards go meanwhile. A job with
    // replicas moves a primary to a server holding no copy of that shard (PickShardMove), which
    // keeps its copies throughout as any replicated move does.
    if (job.state() != v1::JOB_RUNNING || job.spec().consistency().aggregate() ||
        job.elastic().active()) {
      continue;
    }
    // Loads measured while a shard was moving count it on both servers: wait a period.
    if (!job.moves().empty()) {
      const v1::ShardMove& last = *job.moves().rbegin();
      if (last.finished_unix_ms() == 0 ||
          core_.clock().Now() - absl::FromUnixMillis(last.finished_unix_ms()) <
              core_.options().rebalance_every) {
        continue;
      }
    }
    std::optional<ShardMove> pick =
        PickShardMove(rec.shard_map, loads, core_.options().rebalance, draining);
    if (!pick.has_value()) continue;
    const std::string why = absl::StrFormat(
        "rebalance: %s carried %.1f MB/s against %.1f MB/s on %s; shard %u carried %.1f MB/s",
        pick->from, pick->from_load / 1e6, pick->to_load / 1e6, pick->to, pick->shard,
        pick->bytes_per_sec / 1e6);
    v1::ShardMove queued;
    absl::Status s = core_.QueueMove(rec, pick->shard, /*from=*/"", pick->to, why, &queued);
    if (s.ok()) {
      Log()->info("job {}: {}; moving it", id, why);
    } else {
      Log()->debug("job {}: rebalancer's move not queued: {}", id, s);
    }
  }
}

void MovesPass::ExecuteMove(const std::string& job_id) {
  v1::ShardMove move;
  bool resumed = false, finishing = false;
  std::string primary;  // The shard's primary as the move starts (`from` unless move.backup()).
  v1::ShardMap before, copying;
  absl::flat_hash_map<std::string, std::string> address;
  // Updates the job's last move (if it is still this one) and persists.
  auto record = [&](const std::function<void(v1::ShardMove*)>& edit) {
    JobRecord* rec = core_.jobs().Find(job_id);
    if (rec == nullptr || rec->job.moves().empty()) return;
    v1::ShardMove* last = rec->job.mutable_moves(rec->job.moves_size() - 1);
    if (last->requested_unix_ms() != move.requested_unix_ms() || last->shard() != move.shard()) {
      return;
    }
    edit(last);
    if (!core_.jobs().Persist(*rec).ok())
      return;  // The store failed (logged): nothing more is sent.
  };
  auto give_up = [&](const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu()) {
    record([&](v1::ShardMove* m) {
      m->set_state(v1::MOVE_FAILED);
      m->set_result(why);
      m->set_finished_unix_ms(absl::ToUnixMillis(core_.clock().Now()));
    });
    core_.counters().moves_failed->Add();
    if (JobRecord* rec = core_.jobs().Find(job_id); rec != nullptr) {
      v1::ShardMove failed = move;
      failed.set_result(why);
      core_.CountElasticMove(*rec, failed, /*done=*/false);
      (void)core_.jobs().Persist(*rec);  // A failure is the sticky store error (logged).
      core_.WantMoves();                 // A change's next step.
    }
    Log()->warn("job {}: move of shard {} from {} to {} given up: {}", job_id, move.shard(),
                move.from(), move.to(), why);
  };
  // A target that holds none of the job's shards (one joining the job) is given the job's
  // tables as its primary declared them (CreateTables is idempotent: again after a restart).
  std::optional<v1::CreateTablesRequest> tables;
  std::string table_error;
  uint32_t min_attempt = 0;  // The lowest attempt the job's ranks run (the new server's fence).
  {
    v1::ShardMove peek;
    std::string primary_id, primary_address;
    v1::JobSpec spec;
    bool holds = false;
    {
      absl::MutexLock l(&core_.mu());
      JobRecord* rec = core_.jobs().Find(job_id);
      if (rec == nullptr || rec->job.moves().empty()) return;
      peek = *rec->job.moves().rbegin();
      spec = rec->job.spec();
      min_attempt = ~0u;
      for (uint32_t r = 0; r < spec.num_workers(); ++r) {
        min_attempt = std::min(min_attempt, RankAttempt(rec->job.recovery(), r));
      }
      if (min_attempt == ~0u) min_attempt = 0;
      for (const v1::ShardAssignment& a : rec->shard_map.assignments()) {
        holds = holds || a.primary() == peek.to() || Holds(a.backups(), peek.to());
        if (a.shard() == peek.shard()) primary_id = a.primary();
      }
      for (const v1::ServerEndpoint& ep : rec->shard_map.servers()) {
        if (ep.node_id() == primary_id) primary_address = ep.address();
      }
    }
    if (!holds && (peek.state() == v1::MOVE_QUEUED || peek.state() == v1::MOVE_COPYING)) {
      auto made = TablesFromPrimary(job_id, spec, primary_id, primary_address);
      if (made.ok()) {
        tables = std::move(*made);
      } else {
        table_error = std::string(made.status().message());
      }
    }
  }
  {
    absl::MutexLock l(&core_.mu());
    JobRecord* rec = core_.jobs().Find(job_id);
    if (rec == nullptr || rec->job.moves().empty()) return;
    move = *rec->job.moves().rbegin();
    // COPYING here: a move the scheduler was carrying out when it stopped (the servers kept
    // its copy going): it resumes waiting for the copy.
    resumed = move.state() == v1::MOVE_COPYING;
    if (move.state() != v1::MOVE_QUEUED && !resumed) return;
    if (rec->job.state() != v1::JOB_RUNNING) {
      give_up(absl::StrCat("the job is ", JobStateName(rec->job.state())));
      return;
    }
    before = rec->shard_map;
    v1::ShardAssignment* a = AssignmentOf(before, move.shard());
    if (a != nullptr) primary = a->primary();
    // Where the two copies stand: both held while the new one is copied (map 1); after map 2,
    // only `to` (switched) or only `from` (the copy dropped).
    const bool to_backs = a != nullptr && Holds(a->backups(), move.to());
    const bool from_holds = a != nullptr && (move.backup() ? Holds(a->backups(), move.from())
                                                           : a->primary() == move.from());
    const bool to_holds =
        a != nullptr && (move.backup() ? to_backs : a->primary() == move.to() && !to_backs);
    // The scheduler stopped after it had saved the move's last map: send that map again (a
    // server ignores one it has) and conclude.
    finishing = resumed && !(from_holds && to_backs) && from_holds != to_holds;
    if (!finishing &&
        (a == nullptr || !from_holds || to_backs != resumed || a->primary() == move.to())) {
      give_up("the shard map changed since the move was queued");
      return;
    }
    if (!finishing && !table_error.empty()) {
      give_up(absl::StrCat("the job's tables for ", move.to(), ": ", table_error));
      return;
    }
    for (const v1::ServerEndpoint& ep : before.servers()) address[ep.node_id()] = ep.address();
    copying = before;
    if (finishing) {
      // Map 1 as it was (its epoch aside): which copies map 2 made new is measured against it.
      v1::ShardAssignment* c = AssignmentOf(copying, move.shard());
      if (!move.backup() && c->primary() == move.to()) {
        c->set_primary(move.from());
        primary = move.from();
      }
      if (move.backup() && !Holds(c->backups(), move.from())) c->add_backups(move.from());
      if (!Holds(c->backups(), move.to())) c->add_backups(move.to());
    }
    if (!resumed) {
      if (!address.contains(move.to())) {
        // The target joins the job: it enters the map (and the job's servers) with its copy.
        std::optional<v1::NodeStatus> target = core_.registry().Get(move.to());
        if (!target.has_value() || target->state() != v1::NODE_ALIVE ||
            target->drain() != v1::NODE_IN_SERVICE) {
          give_up(absl::StrCat("server ", move.to(), " is no longer alive and in service"));
          return;
        }
        v1::ServerEndpoint* ep = copying.add_servers();
        ep->set_node_id(move.to());
        ep->set_address(target->info().address());
        address[move.to()] = ep->address();
        rec->job.add_servers(move.to());
      }
      absl::StatusOr<uint64_t> epoch = core_.NextEpoch(*rec, before.epoch());
      if (!epoch.ok()) return;  // The store failed: nothing is sent.
      copying.set_epoch(*epoch);
      AssignmentOf(copying, move.shard())->add_backups(move.to());
      rec->shard_map = copying;
      rec->job.set_shard_map_epoch(copying.epoch());
      if (!core_.jobs().Persist(*rec, &copying).ok()) return;  // Not written: not sent either.
      record([&](v1::ShardMove* m) { m->set_state(v1::MOVE_COPYING); });
    }
  }
  Log()->info("job {}: moving shard {}{} from {} to {}: live copy of {}'s (map epoch {}){}", job_id,
              move.shard(), move.backup() ? "'s backup" : "", move.from(), move.to(), primary,
              copying.epoch(), resumed ? ", resumed after a restart" : "");
  // Sends `map` to `first` (if any), then to every other server of `map` but those in `skip` at
  // once (unless `first_only`).
  auto install = [&](const v1::ShardMap& map, const std::string& first,
                     const std::function<void(v1::UpdateShardMapRequest*)>& extra,
                     const std::vector<std::string>& skip = {}, bool first_only = false) {
    auto request = [&](const std::string& node) {
      v1::UpdateShardMapRequest req;
      *req.mutable_map() = map;
      req.set_self(node);
      extra(&req);
      return req;
    };
    if (!first.empty()) {
      absl::Status s = core_.rpc().UpdateShardMap(address[first], request(first));
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("server ", first, ": ", s.message()));
    }
    if (first_only) return absl::OkStatus();
    std::vector<std::string> rest;
    for (const v1::ServerEndpoint& ep : map.servers()) {
      if (ep.node_id() != first &&
          std::find(skip.begin(), skip.end(), ep.node_id()) == skip.end()) {
        rest.push_back(ep.node_id());
      }
    }
    std::vector<absl::Status> status(rest.size());
    ParallelFor(rest.size(), [&](size_t i) {
      status[i] = core_.rpc().UpdateShardMap(address[rest[i]], request(rest[i]));
    });
    for (size_t i = 0; i < rest.size(); ++i) {
      if (!status[i].ok()) {
        return absl::Status(status[i].code(),
                            absl::StrCat("server ", rest[i], ": ", status[i].message()));
      }
    }
    return absl::OkStatus();
  };
  absl::Time t0 = absl::Now(), t1 = t0;
  absl::Status s;
  v1::ShardMap next = before;
  if (!finishing) {
    // Map 1: the target's live copy first, then the primary's snapshot. Real time measures how
    // fast the servers are (copy_ms, switch_ms); the wait for the copy is bounded on the
    // scheduler's clock (fake in tests).
    t0 = absl::Now();
    const absl::Time wait_start = core_.clock().Now();
    s = resumed ? absl::OkStatus()
                : install(
                      copying, move.to(),
                      [&](v1::UpdateShardMapRequest* req) {
                        v1::ReplicaSeed* seed = req->add_copy_from();
                        seed->set_primary(primary);
                        seed->set_live(true);
                        if (tables.has_value()) req->set_min_attempt(min_attempt);
                      },
                      /*skip=*/{}, /*first_only=*/true);
    if (s.ok() && tables.has_value()) {
      // After its map (which waits, pending, for the tables): the tables and the copy with them.
      s = core_.rpc().CreateTables(address[move.to()], *tables);
      if (!s.ok())
        s = absl::Status(s.code(), absl::StrCat("server ", move.to(), ": ", s.message()));
    }
    if (s.ok() && !resumed) {
      s = install(copying, primary,
                  [&](v1::UpdateShardMapRequest* req) {
                    req->set_seed_new_backups(req->self() == primary);
                  },
                  /*skip=*/{move.to()});
    }
    // Until the copy has caught up.
    while (s.ok()) {
      {
        absl::MutexLock l(&core_.mu());
        if (core_.stopping()) {
          Log()->info("job {}: the move of shard {} resumes at the scheduler's next start", job_id,
                      move.shard());
          return;
        }
        JobRecord* rec = core_.jobs().Find(job_id);
        if (rec == nullptr || rec->job.state() != v1::JOB_RUNNING ||
            rec->shard_map.epoch() != copying.epoch()) {
          s = absl::AbortedError("the job stopped running or its shard map changed meanwhile");
          break;
        }
      }
      auto st = core_.rpc().ServerStatus(address[move.to()], job_id);
      bool caught_up = false;
      if (st.ok() && st->jobs_size() == 1) {
        for (const v1::ReplicaOnServer& r : st->jobs(0).replicas()) {
          caught_up = caught_up || (r.primary() == primary && r.caught_up());
        }
      }
      if (caught_up) {
        // The copy is exact. The switch waits for the workers' next step end (PaceToAStep).
        PaceToAStep(job_id, address[primary], copying.epoch());
        break;
      }
      if (core_.clock().Now() - wait_start > core_.options().move_copy_timeout) {
        s = absl::DeadlineExceededError(
            absl::StrCat("the copy on ", move.to(), " did not catch up within ",
                         absl::FormatDuration(core_.options().move_copy_timeout),
                         st.ok() ? " (it needs the primary's snapshot and clocks)"
                                 : absl::StrCat(": ", st.status().message())));
        break;
      }
      core_.clock().SleepFor(kCopyPoll);
    }
    t1 = absl::Now();
    // Map 2 switches the primary; or, when the copy could not be made, one that drops it.
    next = copying;
    v1::ShardAssignment* a = AssignmentOf(next, move.shard());
    // The copy leaves the backups; kept (below), it takes `from`'s place.
    auto* backups = a->mutable_backups();
    backups->erase(std::remove(backups->begin(), backups->end(), move.to()), backups->end());
    {
      absl::MutexLock l(&core_.mu());
      JobRecord* rec = core_.jobs().Find(job_id);
      if (rec == nullptr || rec->shard_map.epoch() != copying.epoch()) {
        // Another change of the map (a recovery) took over: it decides where the shard lives.
        give_up(s.ok() ? "the job's shard map changed meanwhile" : std::string(s.message()));
        return;
      }
      const bool running = rec->job.state() == v1::JOB_RUNNING;
      if (s.ok() && running) {
        if (!move.backup()) {
          a->set_primary(move.to());
        } else {
          std::replace(backups->begin(), backups->end(), move.from(), move.to());
        }
      }
      absl::StatusOr<uint64_t> epoch = core_.NextEpoch(*rec, copying.epoch());
      if (!epoch.ok()) return;  // The store failed: nothing is sent.
      next.set_epoch(*epoch);
      rec->shard_map = next;
      rec->job.set_shard_map_epoch(next.epoch());
      if (!core_.jobs().Persist(*rec, &next).ok()) return;  // Not written: not sent either.
      if (!running) {
        // A recovery started meanwhile: it sends its own maps, made from this one (the shard
        // where it was, without the copy).
        give_up(absl::StrCat("the job is ", JobStateName(rec->job.state())));
        return;
      }
    }
  }
  // Map 2, the primary first (the old one stops applying the shard and hands the copy, and every
  // backup that keeps its copy, everything it applied). With replicas, a backup kept under the
  // shard's new primary takes the map before it does: the new primary's clocks (or, for a copy
  // made anew, its snapshot), sent as the map takes effect there, must find the backup's copy
  // under the new primary, not land in its old one; then the rest.
  std::vector<std::string> fresh, settled = {primary};
  for (const v1::ServerEndpoint& ep : next.servers()) {
    if (ep.node_id() == primary) continue;
    (NewlyBacked(copying, next, ep.node_id()).empty() ? settled : fresh).push_back(ep.node_id());
  }
  // A backup that keeps backing the moved shard under its new primary takes that copy from the
  // one it holds under the old primary (which hands everything over to it before the backup
  // gets the map): the new primary sends it its clocks, not a second snapshot, and the shard has
  // its copies throughout.
  std::vector<std::string> holding;
  for (const v1::ServerEndpoint& ep : next.servers()) {
    if (!move.backup() && s.ok() && ep.node_id() != move.to() &&
        HeldBefore(copying, next, ep.node_id(), move.to()) == primary) {
      holding.push_back(ep.node_id());
    }
  }
  auto map2 = [&](v1::UpdateShardMapRequest* req) {
    req->set_seed_new_backups(true);
    for (const std::string& p : NewlyBacked(copying, next, req->self())) {
      v1::ReplicaSeed* seed = req->add_copy_from();
      seed->set_primary(p);
      seed->set_live(true);
      if (p == move.to() &&
          std::find(holding.begin(), holding.end(), req->self()) != holding.end()) {
        seed->set_held_from(primary);
      }
    }
    if (req->self() == primary || req->self() == move.to()) {
      for (const std::string& h : holding) req->add_backups_holding_copies(h);
    }
  };
  absl::Status switched = install(next, primary, map2, {}, /*first_only=*/true);
  if (switched.ok() && !fresh.empty()) switched = install(next, "", map2, /*skip=*/settled);
  if (switched.ok()) {
    fresh.push_back(primary);
    switched = install(next, "", map2, /*skip=*/fresh);
  }
  const absl::Time t2 = absl::Now();
  if (switched.ok() && s.ok()) {
    // Done once those copies have their snapshot (and every worker a step on them): the next
    // move of a drain may take one of the other copies away.
    for (const v1::ServerEndpoint& ep : next.servers()) {
      for (const std::string& p : NewlyBacked(copying, next, ep.node_id())) {
        const absl::Time since = core_.clock().Now();
        while (true) {
          auto st = core_.rpc().ServerStatus(ep.address(), job_id);
          bool caught_up = false;
          if (st.ok() && st->jobs_size() == 1) {
            for (const v1::ReplicaOnServer& r : st->jobs(0).replicas()) {
              caught_up = caught_up || (r.primary() == p && r.caught_up());
            }
          }
          if (caught_up) break;
          {
            absl::MutexLock l(&core_.mu());
            JobRecord* rec = core_.jobs().Find(job_id);
            if (core_.stopping() || rec == nullptr || rec->job.state() != v1::JOB_RUNNING ||
                rec->shard_map.epoch() != next.epoch()) {
              break;  // Whatever changed decides about the copies now.
            }
          }
          if (core_.clock().Now() - since > core_.options().move_copy_timeout) {
            Log()->warn("job {}: {}'s new copy of {}'s shards did not catch up within {}", job_id,
                        ep.node_id(), p, absl::FormatDuration(core_.options().move_copy_timeout));
            break;
          }
          core_.clock().SleepFor(kCopyPoll);
        }
      }
    }
  }
  absl::MutexLock l(&core_.mu());
  JobRecord* rec = core_.jobs().Find(job_id);
  if (!switched.ok() && rec != nullptr && rec->job.state() == v1::JOB_RUNNING &&
      rec->shard_map.epoch() == next.epoch()) {
    // Some server could not take the map: the job cannot go on with two views of the shard.
    core_.StartRecovery(*rec, absl::StrCat("moving shard ", move.shard(), " to ", move.to(),
                                           " failed: ", switched.message()));
  }
  if (finishing && AssignmentOf(next, move.shard())->primary() != move.to()) {
    s = absl::AbortedError("the copy had not caught up when the scheduler stopped; it was dropped");
  }
  if (!s.ok() || !switched.ok()) {
    give_up(!s.ok() ? std::string(s.message()) : std::string(switched.message()));
    return;
  }
  record([&](v1::ShardMove* m) {
    m->set_state(v1::MOVE_DONE);
    m->set_epoch(next.epoch());
    m->set_copy_ms(Ms(t1 - t0));
    m->set_switch_ms(Ms(t2 - t1));
    m->set_finished_unix_ms(absl::ToUnixMillis(core_.clock().Now()));
    m->set_result(
        absl::StrFormat("copied in %.0f ms, switched in %.0f ms", Ms(t1 - t0), Ms(t2 - t1)));
  });
  if (rec != nullptr) {
    rec->job.set_shard_moves(rec->job.shard_moves() + 1);
    core_.CountElasticMove(*rec, move, /*done=*/true);
    if (rec->job.elastic().active()) core_.WantMoves();  // Its next step right away.
    if (!core_.jobs().Persist(*rec).ok()) return;        // The store failed (logged).
  }
  core_.counters().moves_done->Add();
  Log()->info(
      "job {}: shard {}{} moved from {} to {} (map epoch {}; copy caught up in {:.0f} ms, "
      "switch {:.0f} ms)",
      job_id, move.shard(), move.backup() ? "'s backup" : "", move.from(), move.to(), next.epoch(),
      Ms(t1 - t0), Ms(t2 - t1));
  core_.Wake();
}

void MovesPass::PaceToAStep(const std::string& job_id, const std::string& address,
                            uint64_t epoch) {
  auto still_on = [&] {
    absl::MutexLock l(&core_.mu());
    JobRecord* rec = core_.jobs().Find(job_id);
    return !core_.stopping() && rec != nullptr && rec->job.state() == v1::JOB_RUNNING &&
           rec->shard_map.epoch() == epoch;
  };
  if (!still_on()) return;
  // Each rank's clock there now; then until each moved past it.
  absl::flat_hash_map<uint32_t, int64_t> from;
  const absl::Time since = core_.clock().Now();
  while (core_.clock().Now() - since <= core_.options().move_copy_timeout) {
    auto st = core_.rpc().ServerStatus(address, job_id);
    if (st.ok() && st->jobs_size() == 1) {
      const v1::JobOnServer& j = st->jobs(0);
      if (j.clocks().empty()) return;  // No rank's clock to watch.
      absl::flat_hash_set<uint32_t> left(j.left_workers().begin(), j.left_workers().end());
      bool stepped = !from.empty();
      for (const v1::WorkerClock& c : j.clocks()) {
        if (left.contains(c.worker())) continue;
        auto [it, fresh] = from.emplace(c.worker(), c.clock());
        stepped = stepped && !fresh && c.clock() > it->second;
      }
      if (stepped) return;
    }
    core_.clock().SleepFor(kCopyPoll);
    if (!still_on()) return;
  }
}

absl::StatusOr<v1::CreateTablesRequest> MovesPass::TablesFromPrimary(const std::string& job_id,
                                                                     const v1::JobSpec& spec,
                                                                     const std::string& from,
                                                                     const std::string& address) {
  auto st = core_.rpc().ServerStatus(address, job_id);
  if (!st.ok()) {
    return absl::Status(st.status().code(),
                        absl::StrCat("server ", from, ": ", st.status().message()));
  }
  if (st->jobs_size() != 1 || st->jobs(0).job_id() != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("server ", from, " does not hold job ", job_id));
  }
  const v1::JobOnServer& j = st->jobs(0);
  if (!j.left_workers().empty()) {
    // A server made now would wait for that rank's clock, which never moves.
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", j.left_workers(0),
                     " has left the job; no server joins it until the rank is back"));
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
    return absl::FailedPreconditionError(
        absl::StrCat("server ", from, " holds no table of the job yet"));
  }
  *req.mutable_consistency() = spec.consistency();
  req.set_num_workers(j.clocks_size() > 0 ? j.clocks_size() : spec.num_workers());
  req.set_num_virtual_shards(spec.num_virtual_shards());
  req.set_checkpoint_every_steps(spec.checkpoint_every_steps());
  req.set_checkpoint_dir(spec.checkpoint_dir());
  return req;
}

std::unique_ptr<Pass> MakeMovesPass(SchedulerCore& core) {
  return std::make_unique<MovesPass>(core);
}

}  // namespace pscluster::scheduler
