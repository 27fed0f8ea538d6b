#include "scheduler/recovery.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint_file.h"
#include "common/path_root.h"

namespace pscluster::scheduler {
namespace {

struct Candidate {
  std::string path;
  v1::CheckpointHeader header;
};

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

// Written before `rb` by the run that `rb` abandoned.
bool Abandoned(const v1::CheckpointHeader& h,
               const google::protobuf::RepeatedPtrField<v1::Rollback>& rollbacks) {
  for (const v1::Rollback& rb : rollbacks) {
    if (h.epoch() < rb.epoch() && h.step() > rb.step()) return true;
  }
  return false;
}

bool Covers(const std::vector<const Candidate*>& files, uint32_t num_shards) {
  std::vector<bool> covered(num_shards, false);
  uint32_t n = 0;
  for (const Candidate* c : files) {
    for (uint32_t s : c->header.shards()) {
      if (s < num_shards && !covered[s]) {
        covered[s] = true;
        ++n;
      }
    }
  }
  return n == num_shards;
}

}  // namespace

absl::StatusOr<RecoveryPoint> FindRecoveryPoint(
    const std::string& checkpoint_dir, const std::string& job_id, uint32_t num_virtual_shards,
    const google::protobuf::RepeatedPtrField<v1::Rollback>& rollbacks, const std::string& root,
    FileSystem* fs) {
  RecoveryPoint point;
  if (checkpoint_dir.empty()) return point;
  point.dir = JoinPath(checkpoint_dir, job_id);
  absl::Status in_root = CheckUnderRoot(point.dir, root, "checkpoint_dir");
  if (!in_root.ok()) return in_root;
  auto listed = fs->ListDir(point.dir);
  if (!listed.ok()) {
    if (absl::IsNotFound(listed.status())) return point;
    return absl::FailedPreconditionError(absl::StrCat("checkpoint_dir: cannot list ", point.dir,
                                                      ": ", listed.status().message()));
  }
  std::vector<std::string> names;
  for (std::string& name : *listed) {
    if (absl::EndsWith(name, ".ckpt")) names.push_back(std::move(name));
  }

  std::vector<Candidate> candidates;
  for (const std::string& name : names) {
    std::string path = JoinPath(point.dir, name);
    if (absl::Status s = CheckUnderRoot(path, root, "checkpoint file"); !s.ok()) {
      point.skipped.push_back(absl::StrCat(path, ": ", s.message()));
      continue;
    }
    auto h = ReadCheckpointHeader(path, fs);
    if (!h.ok()) {
      point.skipped.push_back(absl::StrCat(path, ": ", h.status().message()));
    } else if (h->job_id() != job_id) {
      point.skipped.push_back(absl::StrCat(path, ": belongs to job '", h->job_id(), "'"));
    } else if (h->num_virtual_shards() != num_virtual_shards) {
      point.skipped.push_back(absl::StrCat(path, ": has ", h->num_virtual_shards(),
                                           " virtual shards, the job ", num_virtual_shards));
    } else if (Abandoned(*h, rollbacks)) {
      point.skipped.push_back(absl::StrCat(path, ": step ", h->step(),
                                           " of a run that a rollback abandoned"));
    } else {
      candidates.push_back(Candidate{std::move(path), std::move(*h)});
    }
  }
  std::map<int64_t, std::vector<const Candidate*>, std::greater<>> by_step;
  for (const Candidate& c : candidates) by_step[c.header.step()].push_back(&c);
  for (auto& [step, files] : by_step) {
    if (!Covers(files, num_virtual_shards)) continue;
    // Read the step's files whole: a damaged one is dropped, and the step may still be covered.
    std::vector<const Candidate*> good;
    for (const Candidate* c : files) {
      auto bytes = fs->ReadFile(c->path);
      absl::Status s = bytes.status();
      if (s.ok()) s = ParseCheckpoint(*bytes, c->path).status();
      if (s.ok()) {
        good.push_back(c);
      } else {
        point.skipped.push_back(absl::StrCat(c->path, ": ", s.message()));
      }
    }
    if (!Covers(good, num_virtual_shards)) continue;
    point.step = step;
    for (const Candidate* c : good) {
      v1::RestoreFile f;
      f.set_path(c->path);
      f.mutable_shards()->CopyFrom(c->header.shards());
      point.files.push_back(std::move(f));
    }
    return point;
  }
  return point;
}

std::vector<std::string> RestoreFilesFor(
    const google::protobuf::RepeatedPtrField<v1::RestoreFile>& files, const v1::ShardMap& map,
    const std::string& server) {
  absl::flat_hash_set<uint32_t> held;  // As primary or backup: a copy restores too.
  for (const v1::ShardAssignment& a : map.assignments()) {
    if (a.primary() == server ||
        std::find(a.backups().begin(), a.backups().end(), server) != a.backups().end()) {
      held.insert(a.shard());
    }
  }
  std::vector<std::string> out;
  for (const v1::RestoreFile& f : files) {
    for (uint32_t s : f.shards()) {
      if (held.contains(s)) {
        out.push_back(f.path());
        break;
      }
    }
  }
  return out;
}

std::optional<v1::ShardMap> AddBackups(
    const v1::ShardMap& map, uint32_t replication, const std::vector<std::string>& servers,
    const std::set<std::pair<std::string, std::string>>& avoid) {
  if (replication <= 1 || servers.empty()) return std::nullopt;
  v1::ShardMap next = map;
  next.set_epoch(map.epoch() + 1);
  bool changed = false;
  for (v1::ShardAssignment& a : *next.mutable_assignments()) {
    // Start at a different server per shard so that the new copies spread.
    for (size_t k = 0; k < servers.size() && static_cast<uint32_t>(a.backups_size()) + 1 <
                                                  replication; ++k) {
      const std::string& s = servers[(a.shard() + k) % servers.size()];
      if (s == a.primary() || avoid.count({a.primary(), s}) > 0 ||
          std::find(a.backups().begin(), a.backups().end(), s) != a.backups().end()) {
        continue;
      }
      a.add_backups(s);
      changed = true;
    }
  }
  if (!changed) return std::nullopt;
  return next;
}

std::vector<std::string> NewlyBacked(const v1::ShardMap& before, const v1::ShardMap& after,
                                     const std::string& server) {
  // A shard backed under another primary is a new copy too (its primary forwards nothing of
  // what the old one applied): the pair counts, not the shard.
  absl::flat_hash_set<std::pair<uint32_t, std::string>> had;
  for (const v1::ShardAssignment& a : before.assignments()) {
    if (std::find(a.backups().begin(), a.backups().end(), server) != a.backups().end()) {
      had.insert({a.shard(), a.primary()});
    }
  }
  std::vector<std::string> out;
  for (const v1::ShardAssignment& a : after.assignments()) {
    const bool backs =
        std::find(a.backups().begin(), a.backups().end(), server) != a.backups().end();
    if (backs && !had.contains({a.shard(), a.primary()}) &&
        std::find(out.begin(), out.end(), a.primary()) == out.end()) {
      out.push_back(a.primary());
    }
  }
  return out;
}

std::string HeldBefore(const v1::ShardMap& before, const v1::ShardMap& after,
                       const std::string& server, const std::string& primary) {
  auto backs = [&](const v1::ShardAssignment& a) {
    return std::find(a.backups().begin(), a.backups().end(), server) != a.backups().end();
  };
  absl::flat_hash_map<uint32_t, std::string> backed;  // Shard -> its primary in `before`.
  for (const v1::ShardAssignment& a : before.assignments()) {
    if (backs(a)) backed[a.shard()] = a.primary();
  }
  std::string from;
  for (const v1::ShardAssignment& a : after.assignments()) {
    if (a.primary() != primary || !backs(a)) continue;
    auto it = backed.find(a.shard());
    if (it == backed.end()) return "";     // New to it: nothing held.
    if (it->second == primary) continue;   // Backed under `primary` already.
    if (!from.empty() && from != it->second) return "";
    from = it->second;
  }
  return from;
}

absl::StatusOr<v1::ShardMap> PromoteBackups(const v1::ShardMap& map, const std::string& dead,
                                            const absl::flat_hash_set<std::string>& live) {
  v1::ShardMap next = map;
  next.set_epoch(map.epoch() + 1);
  absl::flat_hash_set<std::string> named;
  for (v1::ShardAssignment& a : *next.mutable_assignments()) {
    std::vector<std::string> backups;
    for (const std::string& b : a.backups()) {
      if (b != dead && live.contains(b)) backups.push_back(b);
    }
    if (a.primary() == dead) {
      if (backups.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("shard ", a.shard(), " of the lost server has no live backup"));
      }
      a.set_primary(backups.front());
      backups.erase(backups.begin());
    } else if (!live.contains(a.primary())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", a.shard(), "'s primary ", a.primary(), " is not alive either"));
    }
    a.clear_backups();
    for (std::string& b : backups) a.add_backups(std::move(b));
    named.insert(a.primary());
    for (const std::string& b : a.backups()) named.insert(b);
  }
  next.clear_servers();
  for (const v1::ServerEndpoint& ep : map.servers()) {
    if (named.contains(ep.node_id())) *next.add_servers() = ep;
  }
  return next;
}

}  // namespace pscluster::scheduler
