// The data-plane client of the parameter servers, used by workers and benchmarks: routes dense
// blocks and sparse rows to servers with common/sharding.h, and pulls and pushes them over one
// long-lived connection per server (the server's TCP data port when it offers one, in TLS when
// the cluster runs with TLS, authenticated with the job's data secret; else a gRPC PushPull
// stream; see DataTransport), all servers in parallel, with
// payloads sent from and received into the caller's buffers without intermediate copies
// (fp16/bf16 per table).
//
// Every call has a deadline (options.call_timeout, covering retries). A server that refuses a
// request for a stale shard-map epoch makes the client ask options.refresh_shard_map for a newer
// map and retry; UNAVAILABLE (a server restarting, a map not yet installed) is retried with
// backoff. Pushes are tagged (job, worker, step, seq) and retries reuse their tags, so a server
// applies each at most once.
//
// Thread model: a PsClient may be used from several threads at once; calls run concurrently on
// the same streams (each call has its own request ids).
#ifndef PSCLUSTER_SERVER_CLIENT_PS_CLIENT_H_
#define PSCLUSTER_SERVER_CLIENT_PS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/metrics.h"
#include "common/channel.h"
#include "proto/ps.grpc.pb.h"
#include "server/client/dialer.h"
#include "server/client/param_client.h"
#include "server/client/server_connector.h"

namespace pscluster {

// Histograms a client observes each call's duration into (the worker's /metrics); null members
// are not observed. A call that fails is observed too: its time is what the caller waited.
struct CallLatency {
  Histogram* pull = nullptr;
  Histogram* push = nullptr;
  Histogram* push_pull = nullptr;
};

struct PsClientOptions {
  std::string job_id;       // Job whose tables are read and written.
  uint32_t worker = 0;      // This worker's rank (tags pushes, gates BSP/SSP pulls).
  // The task's attempt (Tag.attempt): once the scheduler handed the rank to a newer task, the
  // servers refuse this client's calls with ABORTED, which is returned at once (no retry).
  uint32_t attempt = 0;
  // TLS / bearer token for the server channels. Empty int_args get the data-plane defaults
  // (server/wire.h DataPlaneChannelArgs()).
  ChannelOptions channel;
  // The job's data secret (AssignTaskRequest.data_secret; common/data_auth.h): proven on the
  // TCP and Unix data connections, which a job with a secret requires and which are then used
  // with a bearer credential too. Empty: the connections go unauthenticated (standalone setups
  // of servers without --token_file).
  std::string data_secret;
  // Deadline of each call (Pull, Push, PushPull, control calls), retries and waiting for slow
  // workers under BSP/SSP included.
  absl::Duration call_timeout = absl::Seconds(60);
  // Deadline of the long-lived streams; they are replaced well before it.
  absl::Duration stream_lifetime = absl::Hours(1);
  // Largest payload of one message (sparse requests are split to fit).
  size_t chunk_bytes = 4 << 20;
  // Push payloads up to this size are copied into the message; larger ones are lent to gRPC
  // without a copy (the call then also waits until gRPC has released the caller's memory).
  size_t copy_below_bytes = 64 << 10;
  // First retry delay (doubles up to 1 s).
  absl::Duration retry_backoff = absl::Milliseconds(20);
  // Returns a newer shard map (normally from the scheduler's GetShardMap) after a server said
  // the client's epoch is stale. Unset: such errors are returned to the caller.
  std::function<absl::StatusOr<v1::ShardMap>()> refresh_shard_map;
  DataTransport data_transport = DataTransport::kAuto;
  // Where call durations go; REQUIRES: outlives the client (null: not observed).
  const CallLatency* latency = nullptr;
  // TCP data plane: a thread waiting for a reply checks the socket for this long before it
  // sleeps (0: sleep at once). Small round trips then avoid waking an idle core; waits longer
  // than this cost this much CPU each.
  absl::Duration spin = absl::Microseconds(50);
  // Unix data socket: offer the server shared memory with two rings of this size (requests and
  // replies), so that payloads bypass the socket (0: never; server/shm_ring.h).
  size_t shm_ring_bytes = 16 << 20;
  // How each server is reached (null: over the network, as `channel` and `data_transport` say;
  // both are then unused). Tests connect to servers in this process through one.
  std::shared_ptr<ServerConnector> connector;
};

class PsClient final : public ParamClient {
 public:
  // `map` routes the job's `tables` (the same TableSpecs the job declares). Connects lazily.
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(PsClientOptions options, v1::ShardMap map,
                                                          std::vector<v1::TableSpec> tables);
  ~PsClient();

  // Declares the job's tables on every server of the map (idempotent: every worker calls it
  // at task start).
  using ParamClient::CreateTables;
  absl::Status CreateTables(const v1::ConsistencySpec& consistency, uint32_t num_workers,
                            uint32_t checkpoint_every_steps,
                            const std::string& checkpoint_dir) override;
  // Sends the current map to every server (UpdateShardMap, self = the server's node_id). The
  // scheduler does this in a cluster; standalone setups and tests call it themselves.
  absl::Status InstallShardMap() override;
  // Replaces the routing map (ignored unless its epoch is newer).
  absl::Status SetShardMap(v1::ShardMap map) override;
  v1::ShardMap shard_map() const override;

  // Reads the targets as of `clock` (the step about to be computed). Under BSP/SSP the servers
  // answer once the slowest worker allows it.
  absl::Status Pull(int64_t clock, const PullTargets& targets) override;
  // Pushes the gradients of `step`; with end_of_step (the normal case) every server of the map
  // is told the step is complete, even those that got no gradient, so their clocks advance.
  // Each push of a step gets its own tag; a push that failed and is called again for the same
  // step (with the same gradients) reuses the failed push's tag, so servers that applied part
  // of it do not apply that part twice.
  // REQUIRES: the source buffers stay unchanged until the call returns.
  using ParamClient::Push;
  absl::Status Push(int64_t step, const PushSources& sources, bool end_of_step) override;
  // Push of `step` (with end_of_step) and a pull of `targets` at clock step + 1, in one round
  // trip per server.
  absl::Status PushPull(int64_t step, const PushSources& sources,
                        const PullTargets& targets) override;

  // Every server of the map pages through its keys of `table` (ListKeys: the shards it is
  // primary of); a stale map is refreshed and the listing started again.
  absl::StatusOr<std::vector<uint64_t>> ListKeys(const std::string& table,
                                                 uint64_t max_keys) override;

  // Status of every server, in map order.
  absl::StatusOr<std::vector<v1::ServerStatus>> ServerStatuses();
  // A checkpoint on every server (into `dir`, or the job's configured directory).
  absl::StatusOr<std::vector<v1::CheckpointResponse>> Checkpoint(const std::string& dir = "");
  // Forgets the job on every server.
  absl::Status DropJob();

  // Fails every pull and push in flight, and every later one, with CANCELLED (the task using
  // this client is stopping). Thread-safe; irreversible.
  void Cancel() override;

  // Slowest worker's clock reported by the servers in the last completed pull (-1 = none).
  int64_t last_min_clock() const { return last_min_clock_.load(); }

  Stats stats() const override;

 private:
  struct Impl;
  explicit PsClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<int64_t> last_min_clock_{-1};
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_PS_CLIENT_H_
