// What a worker needs of the parameter servers, as an interface: declare the job's tables,
// pull parameters at a clock, push a step's gradients (or both in one round), follow shard-map
// changes, cancel. PsClient (ps_client.h) implements it over the network; the trainer, its step
// pipeline, evaluator and exporter use only this, so they are also tested against
// FakeParamClient (testing/fake_param_client.h) without sockets or servers.
//
// Thread model: implementations may be used from several threads at once.
#ifndef PSCLUSTER_SERVER_CLIENT_PARAM_CLIENT_H_
#define PSCLUSTER_SERVER_CLIENT_PARAM_CLIENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/common.pb.h"
#include "proto/job.pb.h"

namespace pscluster {

// Read a whole dense table into `data` (TableSpec elements, row-major).
struct DenseTarget {
  std::string table;
  float* data = nullptr;
};
// Read the rows of `keys` (duplicates allowed) into `rows` (keys.size() * row_width floats).
struct SparseTarget {
  std::string table;
  absl::Span<const uint64_t> keys;
  float* rows = nullptr;
};
struct PullTargets {
  std::vector<DenseTarget> dense;
  std::vector<SparseTarget> sparse;
  // What the servers hold, even of tables with pull compression (whose pulls otherwise give
  // this client's copy, which may lag by what is still owed): evaluation and export. Such a
  // pull neither uses nor changes the copy.
  bool exact = false;
};

// Gradient of a whole dense table (TableSpec elements).
struct DenseSource {
  std::string table;
  const float* grad = nullptr;
};
// Gradient rows for `keys` (keys.size() * row_width floats); duplicate keys add up.
struct SparseSource {
  std::string table;
  absl::Span<const uint64_t> keys;
  const float* grads = nullptr;
};
struct PushSources {
  std::vector<DenseSource> dense;
  std::vector<SparseSource> sparse;
};

class ParamClient {
 public:
  // Where a client's time went since it was created (summed over calling threads).
  struct Stats {
    double plan_sec = 0;  // Routing, summing sparse rows, fp16/bf16 encoding.
    double send_sec = 0;  // Framing messages and queueing them on the streams.
    double wait_sec = 0;  // Waiting for replies: network, server work, parked pulls.
    double copy_sec = 0;  // Copying (and widening) replies into the caller's buffers.
    uint64_t calls = 0;   // Pull / Push / PushPull calls completed.
    uint64_t retries = 0; // Attempts repeated after a stale map or an unavailable server.
    // Calls whose replies from several servers' TCP connections were read by one thread
    // together (TcpConn::WaitAll).
    uint64_t joint_waits = 0;
  };

  virtual ~ParamClient() = default;

  // Declares the job's tables (idempotent: every worker calls it at task start), with the job's
  // consistency model, number of workers and, when checkpoint_every_steps > 0, where the
  // servers checkpoint.
  virtual absl::Status CreateTables(const v1::ConsistencySpec& consistency,
                                    uint32_t num_workers, uint32_t checkpoint_every_steps,
                                    const std::string& checkpoint_dir) = 0;
  absl::Status CreateTables(const v1::ConsistencySpec& consistency, uint32_t num_workers) {
    return CreateTables(consistency, num_workers, 0, "");
  }
  // Sends the current shard map to the servers (standalone runs; a scheduler does it otherwise).
  virtual absl::Status InstallShardMap() = 0;
  // Replaces the routing map (ignored unless its epoch is newer).
  virtual absl::Status SetShardMap(v1::ShardMap map) = 0;
  virtual v1::ShardMap shard_map() const = 0;

  // Reads `targets` as of `clock` (the step about to be computed); the consistency model may
  // make it wait for slower workers.
  virtual absl::Status Pull(int64_t clock, const PullTargets& targets) = 0;
  // Pushes the gradients of `step`. end_of_step: the step is complete (the normal case). A push
  // repeated for the same step after a failure is applied at most once.
  // REQUIRES: the source buffers stay unchanged until the call returns.
  virtual absl::Status Push(int64_t step, const PushSources& sources, bool end_of_step) = 0;
  absl::Status Push(int64_t step, const PushSources& sources) {
    return Push(step, sources, true);
  }
  // Push of `step` and a pull of `targets` at clock step + 1, in one round where possible.
  virtual absl::Status PushPull(int64_t step, const PushSources& sources,
                                const PullTargets& targets) = 0;

  // The keys of sparse table `table` that hold a row on the servers (in memory or on a disk
  // tier), increasing: what an export over the user's keys writes. RESOURCE_EXHAUSTED naming
  // the table and `max_keys` when there are more.
  virtual absl::StatusOr<std::vector<uint64_t>> ListKeys(const std::string& table,
                                                         uint64_t max_keys) = 0;

  // Fails every call in flight, and every later one, with CANCELLED. Irreversible.
  virtual void Cancel() = 0;

  virtual Stats stats() const = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_PARAM_CLIENT_H_
