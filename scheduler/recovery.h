// What a recovering job restores: the newest step at which the job's checkpoint files, as the
// servers wrote them under `checkpoint_dir/<job id>/`, cover every virtual shard.
//
// Files are read by this process, so the scheduler must see the directory at the same path as
// the servers (one host, or a shared file system). Headers are read first; only the files of
// the chosen step are read whole and checked (CRC-32C). Files that fail a check, belong to
// another job or layout, or were written by a run that a rollback abandoned (an older shard-map
// epoch at a later step than the rollback's) are skipped and listed. Thread-compatible; does
// blocking file I/O.
#ifndef PSCLUSTER_SCHEDULER_RECOVERY_H_
#define PSCLUSTER_SCHEDULER_RECOVERY_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "google/protobuf/repeated_field.h"
#include "common/file_system.h"
#include "proto/scheduler.pb.h"

namespace pscluster::scheduler {

struct RecoveryPoint {
  int64_t step = 0;                    // 0 with no files: the job starts again from scratch.
  std::vector<v1::RestoreFile> files;  // All at `step`; together they cover every shard.
  std::vector<std::string> skipped;    // "PATH: why" for each file not usable.
  std::string dir;                     // Where it looked.
};

// A missing directory means no checkpoints (step 0); one that cannot be listed is an error
// naming it. With `root` (a ResolveRoot result), a directory outside it is an error
// (PERMISSION_DENIED naming the root) and a file that leads out of it (a symlink) is skipped;
// that check resolves paths on the machine's file system. The directory is listed and the files
// read through `fs`.
absl::StatusOr<RecoveryPoint> FindRecoveryPoint(
    const std::string& checkpoint_dir, const std::string& job_id, uint32_t num_virtual_shards,
    const google::protobuf::RepeatedPtrField<v1::Rollback>& rollbacks,
    const std::string& root = "", FileSystem* fs = FileSystem::Default());

// The paths of `files` holding a shard that `server` is primary for in `map`.
// The map after server `dead` is lost, with no rollback (replication > 1): each shard it was
// primary of gets its first live backup as primary; `dead` and servers not in `live` leave
// every backup list; no backup is added (a copy starts with its job's tables). Epoch + 1.
// FAILED_PRECONDITION naming the shard when a lost primary has no live backup.
absl::StatusOr<v1::ShardMap> PromoteBackups(const v1::ShardMap& map, const std::string& dead,
                                            const absl::flat_hash_set<std::string>& live);

// `map` with every shard given backups up to `replication - 1`, from `servers` (node_ids, each
// named in the map's servers), never its primary or one of its backups twice, nor a server
// paired with the shard's primary in `avoid` ((primary, server): one the primary cannot reach);
// epoch + 1. Returns nullopt when no shard gained one.
std::optional<v1::ShardMap> AddBackups(
    const v1::ShardMap& map, uint32_t replication, const std::vector<std::string>& servers,
    const std::set<std::pair<std::string, std::string>>& avoid = {});
// The primaries whose shards `server` backs up in `after` but not all of them in `before` (a
// shard it backed under another primary counts as new): it needs a fresh copy of each
// (UpdateShardMapRequest.copy_from).
std::vector<std::string> NewlyBacked(const v1::ShardMap& before, const v1::ShardMap& after,
                                     const std::string& server);
// The previous primary under which `server` backed, in `before`, every shard it newly backs
// under `primary` in `after` (shards whose primary moved to `primary`): its new copy can be
// taken from the copy it holds (ReplicaSeed.held_from). Empty when there is none: a shard it
// did not back before, or two previous primaries.
std::string HeldBefore(const v1::ShardMap& before, const v1::ShardMap& after,
                       const std::string& server, const std::string& primary);

std::vector<std::string> RestoreFilesFor(
    const google::protobuf::RepeatedPtrField<v1::RestoreFile>& files, const v1::ShardMap& map,
    const std::string& server);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_RECOVERY_H_
