// Small helpers shared by the scheduler's core, its passes and its handlers (internal to
// //scheduler).
#ifndef PSCLUSTER_SCHEDULER_PASS_HELPERS_H_
#define PSCLUSTER_SCHEDULER_PASS_HELPERS_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "proto/scheduler.pb.h"

namespace pscluster::scheduler {

// How often a job's DropJob, or a recovery waiting for a job's tasks to stop, looks again
// whether its workers have stopped.
inline constexpr absl::Duration kStopRecheck = absl::Milliseconds(100);

// Cleanups of jobs that ended this recently are repeated after a scheduler restart and sent to a
// server that comes back after its lease lapsed (they are idempotent).
inline constexpr absl::Duration kRecentlyEnded = absl::Minutes(10);

// The scheduler's logger.
std::shared_ptr<spdlog::logger> Log();

inline int64_t UnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

// Alive or suspect (heartbeats late, lease not yet expired).
inline bool IsLive(const v1::NodeStatus& n) {
  return n.state() == v1::NODE_ALIVE || n.state() == v1::NODE_SUSPECT;
}

// Whether a worker can run a task of `spec`: enough GPUs, and --allow_entrypoints for a job that
// runs the user's command.
inline bool WorkerFitsJob(const v1::NodeInfo& worker, const v1::JobSpec& spec) {
  return worker.capacity().gpus() >= spec.gpus_per_worker() &&
         (!spec.has_entrypoint() || worker.allow_entrypoints());
}

// The reason of every move an elastic change (scale, drain) queues starts with this.
inline constexpr char kElasticReason[] = "elastic: ";

// Whether `node` is among `servers` (a shard's backups, a job's servers).
inline bool Holds(const google::protobuf::RepeatedPtrField<std::string>& servers,
                  const std::string& node) {
  return std::find(servers.begin(), servers.end(), node) != servers.end();
}

inline bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// `shard`'s assignment in `map`, or nullptr.
inline v1::ShardAssignment* AssignmentOf(v1::ShardMap& map, uint32_t shard) {
  for (auto& a : *map.mutable_assignments()) {
    if (a.shard() == shard) return &a;
  }
  return nullptr;
}

// Calls `call` on every server of `map` at once; returns each one's clock (-1 where it failed),
// and in *why the first failure, naming its server (empty: none).
std::vector<int64_t> ClockOnEveryServer(
    const v1::ShardMap& map,
    const std::function<absl::StatusOr<int64_t>(const v1::ServerEndpoint&)>& call,
    std::string* why);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_PASS_HELPERS_H_
